"""``cupy-nccl``: a CuPy NCCL communicator per pair, over the tensors' own memory.

Set-up as for the torch transports (``rendezvous``), except that the NCCL
unique id is created by the dialer and travels in its offer on the CPU link
(no store needed).  Transfers run on a stream of the transport's own, made to
wait for the caller's current torch stream with an event before the transfer
and made to signal the caller's stream with another event after it, so the
ordering matches ``torch-nccl`` and the caller's stream is never blocked on
the host.  Host frames (metadata) stay on the CPU link.
"""

from __future__ import annotations

import logging
import time
from typing import Optional, Sequence

from rlinf.scheduler.plugins.transport import DeviceLink, Link, Transport

from . import rendezvous, tuning

log = logging.getLogger("rlinf.nccl")

_NCCL_TYPES = {}


def _nccl_type(dtype):
    """The NCCL data type for a torch dtype; bytes for anything NCCL has no name for."""
    from cupy.cuda import nccl

    if not _NCCL_TYPES:
        import torch

        _NCCL_TYPES.update({
            torch.float32: nccl.NCCL_FLOAT32, torch.float16: nccl.NCCL_FLOAT16, torch.float64: nccl.NCCL_FLOAT64,
            torch.int32: nccl.NCCL_INT32, torch.int64: nccl.NCCL_INT64, torch.uint8: nccl.NCCL_UINT8,
            torch.int8: nccl.NCCL_INT8,
        })
        if hasattr(nccl, "NCCL_BFLOAT16"):
            _NCCL_TYPES[torch.bfloat16] = nccl.NCCL_BFLOAT16
    kind = _NCCL_TYPES.get(dtype)
    return (kind, 1) if kind is not None else (nccl.NCCL_UINT8, None)


def _bounded_init(uid: tuple, rank: int, device: int, deadline: float):
    """``NcclCommunicator(2, uid, rank)`` with a deadline (CuPy's own call waits for the peer without one).

    Past the deadline the setup thread is left behind (NCCL offers no way to
    cancel an init in progress) and TimeoutError is raised.
    """
    import threading

    import cupy
    from cupy.cuda import nccl

    box: dict = {}

    def run():
        try:
            with cupy.cuda.Device(device):
                box["comm"] = nccl.NcclCommunicator(2, uid, rank)
        except BaseException as exc:
            box["error"] = exc

    th = threading.Thread(target=run, name="rlinf-cupy-nccl-init", daemon=True)
    th.start()
    th.join(max(0.0, deadline - time.monotonic()))
    if th.is_alive():
        raise TimeoutError("NCCL communicator setup with the peer did not finish before the deadline")
    if "error" in box:
        raise ConnectionError(f"NCCL communicator setup failed: {box['error']}")
    return box["comm"]


def _refuse_options(options: dict) -> Optional[str]:
    extra = tuning.unknown(options, tuning.CUPY_NCCL)
    if extra:
        return (f"cupy-nccl cannot honour CollectiveGroupOptions field(s) {extra}: CuPy sets NCCL communicators up "
                f"without a config (torch-nccl honours them)")
    return tuning.check(options)


class CupyPairLink(Link, DeviceLink):
    def __init__(self, cpu_link: Link, comm, peer: int, device: int, options: Optional[dict] = None):
        import torch

        #: the CollectiveGroupOptions fields this pair was set up with (the same on both ends)
        self.options = dict(options or {})
        self._cpu = cpu_link
        self._comm = comm
        self._peer = peer
        self._device = device
        # a high-priority stream (torch's highest, -1) when asked for: transfers overtake queued compute
        self._stream = torch.cuda.Stream(device=device, priority=-1 if self.options.get("is_high_priority_stream") else 0)
        self._broken: Optional[str] = None

    def is_open(self) -> bool:
        return self._broken is None and self._cpu.is_open()

    # host frames: the CPU link
    def send(self, frames, deadline, raw=False):
        self._cpu.send(frames, deadline, raw=raw)

    def recv(self, deadline):
        return self._cpu.recv(deadline)

    def recv_into(self, targets, deadline):
        return self._cpu.recv_into(targets, deadline)

    # device tensors
    def _run(self, tensors: Sequence, deadline: Optional[float], send: bool) -> None:
        import torch

        if self._broken:
            raise ConnectionError(f"this pair's NCCL communicator is broken ({self._broken})")
        caller = torch.cuda.current_stream(self._device)
        self._stream.wait_stream(caller)  # after the work already queued by the caller
        try:
            for t in tensors:
                if not t.numel():  # both ends know the shapes: empty tensors move nothing
                    continue
                if not t.is_contiguous():
                    raise ValueError("cupy-nccl moves contiguous tensors only")
                kind, unit = _nccl_type(t.dtype)
                count = t.numel() if unit else t.numel() * t.element_size()
                fn = self._comm.send if send else self._comm.recv
                fn(t.data_ptr(), count, kind, self._peer, self._stream.cuda_stream)
                t.record_stream(self._stream)  # the allocator keeps the memory until the transfer is done
        except Exception as exc:
            self._broken = f"{type(exc).__name__}: {exc}"
            raise ConnectionError(f"NCCL {'send' if send else 'recv'} failed: {exc}") from None
        caller.wait_stream(self._stream)  # the caller's later work sees the data
        if deadline is not None:
            done = torch.cuda.Event()
            done.record(self._stream)
            while not done.query():  # bounded: the host waits at most until the deadline
                if time.monotonic() > deadline:
                    self._broken = "timed out"
                    self._comm.abort()
                    raise TimeoutError("NCCL transfer did not finish before the deadline")
                time.sleep(0.0002)

    def send_tensors(self, tensors, deadline):
        self._run(tensors, deadline, True)

    def recv_tensors_into(self, tensors, deadline):
        self._run(tensors, deadline, False)

    def close(self):
        comm, self._comm = self._comm, None
        self._broken = self._broken or "closed"
        if comm is not None:
            try:
                comm.destroy()
            except Exception:
                pass
        self._cpu.close()


class CupyNcclTransport(Transport):
    name = "cupy-nccl"

    def __init__(self):
        from rlinf.scheduler.plugins import get_registry

        self._cpu: Transport = get_registry().transport("cpu").descriptor.factory()
        self._links: list = []
        self._index: Optional[int] = None

    def _device(self) -> int:
        if self._index is None:  # fixed at first use; CUDA's current device is per thread
            from .devices import default_index

            self._index = default_index()
        return self._index

    def listen(self, on_accept, local_ip: str) -> dict:
        from .devices import device_identity, same_device_reason

        self._device()

        def accepted(cpu_link, data):
            rendezvous.taken(cpu_link)
            try:
                offer, hello = rendezvous.unpack_offer(data)
                deadline = time.monotonic() + rendezvous.DEFAULT_SETUP
                mine = device_identity(self._device())
                options = offer["extra"].get("options") or {}
                reason = same_device_reason(offer["extra"].get("device"), mine) or (
                    _refuse_options(options) if options else None)
                rendezvous.answer(cpu_link, deadline, reason, device=mine)
                if reason:
                    cpu_link.close()
                    return
                device = self._device()
                comm = _bounded_init(tuple(offer["extra"]["uid"]), 1, device, deadline)
            except Exception as exc:
                log.warning("cupy-nccl: pair setup with a connecting peer failed: %s: %s", type(exc).__name__, exc)
                cpu_link.close()
                return
            link = CupyPairLink(cpu_link, comm, 0, device, options)
            self._links.append(link)
            on_accept(link, hello)

        return {"cpu": self._cpu.listen(accepted, local_ip), "backend": "cupy-nccl"}

    def connect(self, endpoint, hello, deadline, options: Optional[dict] = None):
        options = dict(options or {})
        reason = _refuse_options(options) if options else None
        if reason:
            raise ValueError(reason)
        from cupy.cuda import nccl

        from .devices import device_identity

        if deadline is None:
            deadline = time.monotonic() + rendezvous.DEFAULT_SETUP
        uid = nccl.get_unique_id()
        extra = {"uid": list(uid), "device": device_identity(self._device())}  # CuPy's unique id: a tuple of ints
        if options:
            extra["options"] = options
        cpu_link = self._cpu.connect(endpoint["cpu"], rendezvous.pack_offer(hello, extra), deadline)
        try:
            rendezvous.await_answer(cpu_link, deadline)
            device = self._device()
            comm = _bounded_init(tuple(extra["uid"]), 0, device, deadline)
        except BaseException:
            cpu_link.close()
            raise
        link = CupyPairLink(cpu_link, comm, 1, device, options)
        self._links.append(link)
        return link

    def probe(self, endpoint):
        return self._cpu.probe(endpoint["cpu"])

    def close(self):
        for link in self._links:
            link.close()
        self._links = []
        self._cpu.close()
