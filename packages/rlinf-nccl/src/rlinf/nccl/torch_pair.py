"""Transports over a torch.distributed process group of two ranks per pair.

``torch-gloo`` (host buffers, CPU tensors) and ``torch-nccl`` (CUDA tensors)
share everything but the backend: pair setup (``rendezvous``), the small
header on the CPU link, deadlines, failure handling.  Each link owns one
process group; a link whose group failed reports ``is_open() == False`` and
rlinf replaces it with a fresh pair, leaving every other pair alone.

Messages (``Link.send``): a JSON header and the small frames go on the CPU
link; with ``gloo`` larger frames follow through the process group, except
the first (the object's pickle), which always takes the CPU link: gloo's
connections are not authenticated, so only raw bytes, received into buffers
of the sizes the header named, may come through them.  NCCL
moves only device memory, so for ``torch-nccl`` host frames stay on the CPU
link and device tensors use ``send_tensors`` / ``recv_tensors_into`` (the
``DeviceLink`` methods): no header, no host staging, no extra copy.  NCCL
already orders its work after the caller's current stream and makes the
caller's current stream wait for it (with events), so a tensor may be reused
by the stream that produced it as soon as the call returns.
"""

from __future__ import annotations

import collections
import json
import logging
import socket
import threading
import time
import warnings
from typing import Optional, Sequence

from rlinf.scheduler.base import config
from rlinf.scheduler.plugins.transport import DeviceLink, Link, Transport

from . import rendezvous, tuning

log = logging.getLogger("rlinf.nccl")

#: frames up to this size ride on the CPU link with the header
INLINE_MAX = 64 << 10
#: tag of send_tensors payloads: apart from host frames, which gloo's read-ahead thread receives
_DEVICE_TAG = 1
#: bytes of received messages a gloo link holds ahead of the caller
READ_AHEAD = 64 << 20
#: seconds per slice of the read-ahead thread's wait for the next header (it checks for close between)
_SLICE = 0.5


def route_ip(towards: str) -> str:
    """This host's address on the route to ``towards`` (no packet is sent)."""
    if towards.startswith("127."):
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((towards, 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _op_timeout(deadline: Optional[float]):
    return rendezvous.as_timedelta(deadline, config.default_timeout())


def _byte_tensor(buf):
    import torch

    view = memoryview(buf).cast("B")
    if view.readonly:
        with warnings.catch_warnings():  # only read from: torch warns about writes it will not do
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(view, dtype=torch.uint8)
    return torch.frombuffer(view, dtype=torch.uint8)


def _end_group(pg) -> None:
    """Abort (or shut down) a pair's process group; errors of a group already broken are ignored."""
    for name in ("abort", "shutdown"):
        fn = getattr(pg, name, None)
        if fn is not None:
            try:
                fn()
                return
            except Exception:
                pass


class PairLink(Link, DeviceLink):
    """One direction's connection: a CPU link for headers plus a 2-rank process group."""

    def __init__(self, cpu_link: Link, pg, peer_rank: int, host_via_group: bool, store=None,
                 options: Optional[dict] = None):
        #: the CollectiveGroupOptions fields this pair's group was set up with (the same on both ends)
        self.options = dict(options or {})
        self._cpu = cpu_link
        self._pg = pg
        self._peer = peer_rank
        self._host_via_group = host_via_group
        # the pair's LinkStore: torch calls it through pybind, which needs the Python object alive as long
        # as the group (kept after close too: the group's threads may outlive it)
        self._store = store
        self._broken: Optional[str] = None
        self._lock = threading.Lock()
        self._ahead = None
        if host_via_group:
            # gloo's send waits until the receiver posts its recv: a reader thread posts them as
            # messages arrive (as the cpu transport's TCP read-ahead does), so two ends sending
            # large messages to each other at once never wait on each other
            self._ahead = collections.deque()
            self._held = 0
            self._cond = threading.Condition()
            self._reader_error: Optional[BaseException] = None
            threading.Thread(target=self._read_ahead, name="rlinf-gloo-read-ahead", daemon=True).start()

    # -- failure handling ---------------------------------------------------------
    def _op(self, what: str, tensors: list, deadline: Optional[float], tag: int = 0) -> None:
        """One send or recv on the pair's group, waited for until ``deadline``; failures break the pair."""
        try:
            pg = self._pg
            if pg is None:
                raise RuntimeError("link closed")
            work = (pg.send if what == "send" else pg.recv)(tensors, self._peer, tag)
            work.wait(_op_timeout(deadline))
        except RuntimeError as exc:
            text = str(exc)
            self._broken = f"{what} failed: {text.splitlines()[0] if text else type(exc).__name__}"
            if "imed out" in text or "imeout" in text:
                raise TimeoutError(f"process group {what} did not finish before the deadline") from None
            raise ConnectionError(f"process group {what} failed: {text.splitlines()[0] if text else exc}") from None

    def _check(self) -> None:
        if self._broken:
            raise ConnectionError(f"this pair's process group is broken ({self._broken}); rlinf opens a new pair")

    def is_open(self) -> bool:
        return self._broken is None and self._cpu.is_open()

    # -- host messages (the Link contract) -------------------------------------------
    def send(self, frames: Sequence, deadline: Optional[float], raw: bool = False) -> None:
        self._check()
        views = [memoryview(f).cast("B") if not isinstance(f, memoryview) or f.format != "B" or f.ndim != 1 else f
                 for f in frames]
        # the first frame (the object's pickle, or send_tensor's fingerprint) always rides on the CPU link:
        # only raw buffers cross the group, whose connections gloo does not authenticate
        big = [self._host_via_group and i > 0 and v.nbytes > INLINE_MAX for i, v in enumerate(views)]
        head = json.dumps({"s": [v.nbytes for v in views], "b": big}).encode()
        self._cpu.send([head] + [v for v, b in zip(views, big) if not b], deadline, raw=raw)
        for v, b in zip(views, big):
            if b:
                self._op("send", [_byte_tensor(v)], deadline)

    def _head(self, deadline):
        raw, frames = self._cpu.recv(deadline)
        head = json.loads(bytes(frames[0]))
        if head["b"] and head["b"][0]:
            self._broken = "the peer sent a message's first frame through the process group"
            raise ConnectionError(f"{self._broken}; only raw buffers may come that way")
        return raw, head, frames[1:]

    def _read_ahead(self) -> None:
        while self._pg is not None:
            with self._cond:  # bounded: close() and consumers notify
                while self._held >= READ_AHEAD and self._pg is not None:
                    self._cond.wait(_SLICE)
            try:
                raw, head, inline = self._head(time.monotonic() + _SLICE)
            except TimeoutError:
                continue
            except BaseException as exc:
                with self._cond:
                    self._reader_error = exc
                    self._cond.notify_all()
                return
            try:
                frames = self._receive_frames(head, inline, None)
            except BaseException as exc:
                with self._cond:
                    self._reader_error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self._ahead.append((raw, frames))
                self._held += sum(head["s"])
                self._cond.notify_all()

    def _pop(self, deadline: Optional[float]) -> tuple[bool, list]:
        with self._cond:
            while not self._ahead:
                if self._reader_error is not None:
                    err = self._reader_error
                    if isinstance(err, (ConnectionError, TimeoutError)):
                        raise ConnectionError(str(err)) from None
                    raise ConnectionError(f"{type(err).__name__}: {err}") from None
                if self._pg is None:
                    raise ConnectionError("link closed")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("no message before the deadline")
                self._cond.wait(_SLICE if left is None else min(left, _SLICE))
            raw, frames = self._ahead.popleft()
            self._held -= sum(len(f) for f in frames)
            self._cond.notify_all()
            return raw, frames

    def _receive_frames(self, head: dict, inline, deadline) -> list:
        inline = iter(inline)
        out = []
        for size, b in zip(head["s"], head["b"]):
            if b:
                buf = bytearray(size)
                self._op("recv", [_byte_tensor(buf)], deadline)
                out.append(buf)
            else:
                out.append(next(inline))
        return out

    def recv(self, deadline: Optional[float]) -> tuple[bool, list]:
        if self._ahead is not None:
            return self._pop(deadline)
        self._check()
        raw, head, inline = self._head(deadline)
        return raw, self._receive_frames(head, inline, deadline)

    def recv_into(self, targets: Sequence, deadline: Optional[float]) -> bool:
        if self._ahead is not None:
            raw, frames = self._pop(deadline)
            views = [memoryview(t).cast("B") for t in targets]
            if [v.nbytes for v in views] != [len(f) for f in frames]:
                raise ValueError(f"message of frame sizes {[len(f) for f in frames]} does not fit targets "
                                 f"of sizes {[v.nbytes for v in views]}")
            for v, f in zip(views, frames):
                v[:] = memoryview(f).cast("B")
            return raw
        self._check()
        raw, head, inline = self._head(deadline)
        views = [memoryview(t).cast("B") for t in targets]
        if [v.nbytes for v in views] != head["s"]:
            for size, b in zip(head["s"], head["b"]):  # consume the message, then refuse it
                if b:
                    self._op("recv", [_byte_tensor(bytearray(size))], deadline)
            raise ValueError(f"message of frame sizes {head['s']} does not fit targets of sizes {[v.nbytes for v in views]}")
        inline = iter(inline)
        for v, b in zip(views, head["b"]):
            if b:
                self._op("recv", [_byte_tensor(v)], deadline)
            elif v.nbytes:
                v[:] = memoryview(next(inline)).cast("B")
            else:
                next(inline)
        return raw

    # -- device tensors (the DeviceLink contract) ---------------------------------------
    def send_tensors(self, tensors: Sequence, deadline: Optional[float]) -> None:
        self._check()
        for t in tensors:
            if t.numel():  # both ends know the shapes: empty tensors move nothing
                self._op("send", [t], deadline, _DEVICE_TAG)

    def recv_tensors_into(self, tensors: Sequence, deadline: Optional[float]) -> None:
        self._check()
        for t in tensors:
            if t.numel():  # both ends know the shapes: empty tensors move nothing
                self._op("recv", [t], deadline, _DEVICE_TAG)

    def close(self) -> None:
        pg, self._pg = self._pg, None
        if self._broken is None:
            self._broken = "closed"
        if self._ahead is not None:
            with self._cond:
                self._cond.notify_all()
        if pg is not None:
            _end_group(pg)
        self._cpu.close()


class TorchPairTransport(Transport):
    """Base of ``torch-gloo`` and ``torch-nccl``: one process group per link."""

    name = ""
    backend = ""
    host_via_group = False
    #: CollectiveGroupOptions fields this transport honours (its plugin descriptor declares the same)
    honours: tuple = ()

    def __init__(self):
        from rlinf.scheduler.plugins import get_registry

        self._cpu: Transport = get_registry().transport("cpu").descriptor.factory()
        self._links: list = []
        self._lock = threading.Lock()
        self._local_ip = "127.0.0.1"

    # -- what a backend adds --------------------------------------------------------------
    def local_info(self) -> dict:
        """Facts this end tells the other during setup (NCCL: the device)."""
        return {}

    def refuse(self, offer_extra: dict, mine: dict) -> Optional[str]:
        """Why this pair cannot work (checked on the accepting side), or None."""
        return None

    def refuse_options(self, options: dict) -> Optional[str]:
        """Why the dialer's tuning fields cannot configure this end, or None."""
        extra = tuning.unknown(options, self.honours)
        if extra:
            return f"{self.name} here does not honour CollectiveGroupOptions field(s) {extra}"
        return tuning.check(options)

    def make_group(self, store, rank: int, ip: str, deadline: Optional[float], options: dict):
        """The pair's 2-rank process group; ``options``: the tuning fields this transport honours."""
        raise NotImplementedError

    def _group_over(self, cpu_link: Link, rank: int, ip: str, deadline: float, options: dict):
        """``(group, store)``: the pair's group, its rendezvous keys carried on ``cpu_link`` (no listening store)."""
        from .link_store import LinkStore

        store = LinkStore(cpu_link, deadline)
        pg = self.make_group(store, rank, ip, deadline, options)
        try:
            store.finish(deadline)
        except BaseException:
            _end_group(pg)
            raise
        return pg, store

    # -- the Transport contract ---------------------------------------------------------------
    def listen(self, on_accept, local_ip: str) -> dict:
        self._local_ip = local_ip

        def accepted(cpu_link: Link, data: bytes) -> None:
            rendezvous.taken(cpu_link)
            try:
                offer, hello = rendezvous.unpack_offer(data)
            except ValueError as exc:
                log.warning("%s: dropped a connection: %s", self.name, exc)
                cpu_link.close()
                return
            deadline = time.monotonic() + rendezvous.DEFAULT_SETUP
            try:
                mine = self.local_info()
                extra = offer.get("extra", {})
                options = extra.get("options") or {}
                reason = self.refuse(extra, mine) or (self.refuse_options(options) if options else None)
                rendezvous.answer(cpu_link, deadline, reason, **mine)
                if reason:
                    cpu_link.close()
                    return
                pg, store = self._group_over(cpu_link, 1, self._local_ip, deadline, options)
            except Exception as exc:
                log.warning("%s: pair setup with a connecting peer failed: %s: %s", self.name, type(exc).__name__, exc)
                cpu_link.close()
                return
            link = PairLink(cpu_link, pg, 0, self.host_via_group, store=store, options=options)
            with self._lock:
                self._links.append(link)
            on_accept(link, hello)

        return {"cpu": self._cpu.listen(accepted, local_ip), "backend": self.backend}

    def connect(self, endpoint: dict, hello: bytes, deadline: Optional[float], options: Optional[dict] = None) -> Link:
        """Set a pair up; ``options`` (CollectiveGroupOptions fields this transport declares) configure both ends."""
        options = dict(options or {})
        reason = self.refuse_options(options) if options else None
        if reason:
            raise ValueError(reason)
        if deadline is None:
            deadline = time.monotonic() + rendezvous.DEFAULT_SETUP
        ip = route_ip(endpoint["cpu"]["tcp"][0])
        mine = self.local_info()
        offer = {**mine, "options": options} if options else mine
        cpu_link = self._cpu.connect(endpoint["cpu"], rendezvous.pack_offer(hello, offer), deadline)
        try:
            rendezvous.await_answer(cpu_link, deadline)
            pg, store = self._group_over(cpu_link, 0, ip, deadline, options)
        except BaseException:
            cpu_link.close()
            raise
        link = PairLink(cpu_link, pg, 1, self.host_via_group, store=store, options=options)
        with self._lock:
            self._links.append(link)
        return link

    def probe(self, endpoint: dict) -> bool:
        return self._cpu.probe(endpoint["cpu"])

    def close(self) -> None:
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()
        self._cpu.close()


class GlooTransport(TorchPairTransport):
    """``torch-gloo``: CPU tensors and host buffers through torch's gloo backend."""

    name = "torch-gloo"
    backend = "gloo"
    host_via_group = True

    def make_group(self, store, rank, ip, deadline, options):
        import torch.distributed as dist

        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=ip)]
        opts._timeout = rendezvous.as_timedelta(deadline)
        return dist.ProcessGroupGloo(store, rank, 2, opts)


class NcclTransport(TorchPairTransport):
    """``torch-nccl``: CUDA tensors through torch's NCCL backend, one communicator per pair."""

    name = "torch-nccl"
    backend = "nccl"
    host_via_group = False
    honours = tuple(tuning.TORCH_NCCL)

    def __init__(self):
        super().__init__()
        self._index: Optional[int] = None

    def _device_index(self) -> int:
        if self._index is None:  # fixed at first use: every pair of this transport uses one device
            from .devices import default_index

            self._index = default_index()
        return self._index

    def listen(self, on_accept, local_ip: str) -> dict:
        self._device_index()
        return super().listen(on_accept, local_ip)

    def local_info(self) -> dict:
        from .devices import device_identity

        return {"device": device_identity(self._device_index())}

    def refuse(self, offer_extra, mine):
        from .devices import same_device_reason

        return same_device_reason(offer_extra.get("device"), mine.get("device"))

    def make_group(self, store, rank, ip, deadline, options):
        import torch
        import torch.distributed as dist

        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = _op_timeout(None)  # NCCL's watchdog aborts work older than this
        tuning.apply(opts, tuning.torch_nccl_settings(options))  # ncclConfig_t fields, stream priority
        device = torch.device("cuda", self._device_index())
        with torch.cuda.device(device):  # this may run on a transport thread: name the device
            pg = dist.ProcessGroupNCCL(store, rank, 2, opts)
            connect = getattr(pg, "eager_connect_single_device", None)
            if connect is not None:  # set the communicator up now, while the store's deadline holds
                connect(device)
        return pg
