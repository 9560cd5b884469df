"""Objects holding device tensors: metadata on the CPU path, payload on a device link.

``split`` walks an object (tensors, lists, tuples, named tuples, dicts,
dataclasses) and replaces every device tensor with a ``DeviceSlot`` (shape,
dtype, grad flag); CPU tensors stay where they are, so they keep travelling
as CPU tensors.  The skeleton goes through the ordinary CPU path
(``Communicator.send_object``); the device tensors follow, in slot order,
through a ``DeviceLink`` (``send_tensors``): no host staging, no pickling of
their data.  The receiver gets the skeleton, allocates each slot on *its*
current device (``materialize``) and fills them with ``recv_tensors_into``.

Objects of other classes holding device tensors are left whole: they go
through the CPU path as the codec handles them today (host copy).

``DeviceRouter`` does this through any CPU path: the sender's envelope
carries its device-transport endpoint, the receiver dials it once per
direction and keeps the link.  A communicator routes with one call on each
side: ``router.send(send_meta, obj, me, peer, deadline)`` instead of sending
``obj`` when ``needs_device_path(obj)``, and ``router.unwrap(received, me,
deadline)`` on whatever it received.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any, Callable, Optional


@dataclasses.dataclass(frozen=True)
class DeviceSlot:
    """Where a device tensor was; the receiver allocates one like it on its own device."""

    index: int
    shape: tuple
    dtype: str
    requires_grad: bool = False


def _is_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def on_device(t) -> bool:
    return t.device.type != "cpu"


def split(obj: Any, is_device: Callable = on_device) -> tuple[Any, list]:
    """``(skeleton, device tensors)``; the tensors in the order of their slots."""
    tensors: list = []

    def walk(x):
        if _is_tensor(x):
            if not is_device(x):
                return x
            tensors.append(x.detach() if x.requires_grad else x)
            return DeviceSlot(len(tensors) - 1, tuple(x.shape), str(x.dtype).removeprefix("torch."), x.requires_grad)
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()} if type(x) is dict else type(x)((k, walk(v)) for k, v in x.items())
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*(walk(v) for v in x))
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            changes = {f.name: walk(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init}
            return dataclasses.replace(x, **changes)
        return x

    return walk(obj), tensors


def materialize(skeleton: Any, device=None) -> tuple[Any, list]:
    """The object with every slot replaced by a fresh tensor on ``device``; the tensors in slot order.

    ``device`` defaults to the receiver's current accelerator device.
    """
    import torch

    if device is None:
        from ..plugins.accelerator import current

        kind = current().torch_device_type
        device = torch.device(kind, getattr(torch, kind).current_device()) if kind != "cpu" else torch.device("cpu")
    found: dict[int, Any] = {}

    def walk(x):
        if isinstance(x, DeviceSlot):
            t = torch.empty(x.shape, dtype=getattr(torch, x.dtype), device=device)
            found[x.index] = t
            return t.requires_grad_(True) if x.requires_grad else t
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()} if type(x) is not dict else type(x)((k, walk(v)) for k, v in x.items())
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*(walk(v) for v in x))
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return dataclasses.replace(x, **{f.name: walk(getattr(x, f.name)) for f in dataclasses.fields(x) if f.init})
        return x

    obj = walk(skeleton)
    return obj, [found[i] for i in range(len(found))]


def send_object(send_meta: Callable[[Any], None], link, obj: Any, deadline: Optional[float],
                is_device: Callable = on_device) -> None:
    """Send ``obj``: its skeleton through ``send_meta`` (the CPU path), its device tensors through ``link``."""
    skeleton, tensors = split(obj, is_device)
    send_meta(skeleton)
    if tensors:
        link.send_tensors([t if t.is_contiguous() else t.contiguous() for t in tensors], deadline)


def recv_object(recv_meta: Callable[[], Any], link, deadline: Optional[float], device=None) -> Any:
    """Receive what ``send_object`` sent; device tensors land on ``device`` (default: the current one)."""
    skeleton = recv_meta()
    obj, targets = materialize(skeleton, device)
    if targets:
        link.recv_tensors_into(targets, deadline)
    return obj


def may_hold_device_tensors(obj: Any) -> bool:
    """False when this process cannot hold a CUDA tensor at all (torch not imported, CUDA never
    initialised): the send fast path then skips the walk of ``needs_device_path``."""
    global _cuda_seen
    if _cuda_seen:
        return True
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False  # asked again next time: the program may initialise CUDA later
    _cuda_seen = True  # CUDA, once initialised, stays so for the life of the process
    return True


_cuda_seen = False  # torch.cuda was found initialised in this process


def needs_device_path(obj: Any, is_device: Callable = on_device) -> bool:
    """Whether ``obj`` holds a device tensor the walk of ``split`` would find (cheap, stops at the first)."""
    if _is_tensor(obj):
        return is_device(obj)
    if isinstance(obj, dict):
        return any(needs_device_path(v, is_device) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(needs_device_path(v, is_device) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return any(needs_device_path(getattr(obj, f.name), is_device) for f in dataclasses.fields(obj))
    return False




# -- routing through a communicator --------------------------------------------------------------
@dataclasses.dataclass
class DeviceEnvelope:
    """What goes on the CPU path for an object with device tensors.

    ``endpoint`` is the sender's device-transport listener: the receiver dials
    it for the pair's device link (the receiver always dials, so two workers
    sending to each other at once set up one link per direction, never
    waiting on each other).  ``fresh`` asks the receiver to dial again (the
    sender has no open link from it).  ``options``: the tuning fields the
    sender's call set (``CollectiveGroupOptions``), for a link set up now.
    """

    skeleton: Any
    transport: str
    endpoint: dict
    src: str
    fresh: bool
    options: dict = dataclasses.field(default_factory=dict)


class DeviceRouter:
    """One process's device transport and its device links, per peer and direction."""

    def __init__(self, transport: Optional[str] = None, device: str = "cuda"):
        from ..plugins import get_registry

        entry = get_registry().transport(transport, device)
        self.entry = entry
        self.name = entry.name
        self.transport = entry.descriptor.factory()
        self.endpoint: Optional[dict] = None
        self._out: dict = {}  # peer name -> link the peer dialed: we send to it on this one
        self._in: dict = {}  # peer name -> link we dialed: we receive from it on this one
        self._cond = threading.Condition()

    def listen(self, local_ip: str) -> dict:
        with self._cond:
            if self.endpoint is None:
                self.endpoint = self.transport.listen(self._accepted, local_ip)
            return self.endpoint

    def _accepted(self, link, hello: bytes) -> None:
        import json

        try:
            src = json.loads(hello)["src"]
        except Exception:
            link.close()
            return
        with self._cond:
            old = self._out.get(src)
            self._out[src] = link
            self._cond.notify_all()
        if old is not None and old is not link:
            old.close()

    def _send_link(self, peer: str, deadline: Optional[float]):
        import time

        with self._cond:  # bounded by the deadline; the peer dials when it receives the envelope
            while True:
                link = self._out.get(peer)
                if link is not None and link.is_open():
                    return link
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{peer!r} did not open a device link ({self.name}) before the deadline")
                self._cond.wait(1.0 if left is None else min(left, 1.0))

    def link_options(self, options) -> dict:
        """The tuning fields ``options`` (a ``CollectiveGroupOptions`` or None) sets for this router's links.

        ``ValueError`` when this transport cannot honour one (see ``options.link_options``).
        """
        from ..plugins.options import link_options

        return link_options(options, self.entry)

    def send(self, send_meta: Callable[[Any], None], obj: Any, me: str, peer: str, deadline: Optional[float],
             local_ip: str = "127.0.0.1", is_device: Callable = on_device, options: Optional[dict] = None) -> None:
        """Send ``obj`` to ``peer``: the envelope through ``send_meta`` (CPU path), device tensors on the device link.

        ``options`` (from ``link_options``) configure the link if the receiver sets one up for this message.
        """
        skeleton, tensors = split(obj, is_device)
        endpoint = self.listen(local_ip)
        with self._cond:
            link = self._out.get(peer)
            fresh = link is None or not link.is_open()
        send_meta(DeviceEnvelope(skeleton, self.name, endpoint, me, fresh, dict(options or {})))
        if tensors:
            self._send_link(peer, deadline).send_tensors(
                [t if t.is_contiguous() else t.contiguous() for t in tensors], deadline)

    def unwrap(self, received: Any, me: str, deadline: Optional[float], device=None,
               options: Optional[dict] = None) -> Any:
        """What the CPU path delivered, with its device tensors received (anything else as it is).

        ``options``: the receiving call's tuning fields, for a link set up now (the sender's win).
        """
        if not isinstance(received, DeviceEnvelope):
            return received
        obj, targets = materialize(received.skeleton, device)
        link = self._recv_link(received, me, deadline, options)
        if targets:
            link.recv_tensors_into(targets, deadline)
        return obj

    def receive_into(self, received: "DeviceEnvelope", target, me: str, deadline: Optional[float],
                     options: Optional[dict] = None) -> None:
        """``recv_tensor`` of a device tensor: the one announced by ``received`` lands in ``target``.

        Raises ``ValueError`` when the announced tensor has another shape or dtype.
        """
        slot = received.skeleton
        want = (tuple(target.shape), str(target.dtype).removeprefix("torch."))
        link = self._recv_link(received, me, deadline, options)
        if isinstance(slot, DeviceSlot) and (slot.shape, slot.dtype) == want:
            link.recv_tensors_into([target], deadline)
            return
        _, scratch = materialize(slot, target.device)  # take what was sent, so the device link stays in step
        if scratch:
            link.recv_tensors_into(scratch, deadline)
        got = (slot.shape, slot.dtype) if isinstance(slot, DeviceSlot) else f"a {type(slot).__name__}"
        raise ValueError(f"the sender's tensor is {got}, the buffer given here {want}; the message was discarded")

    def _recv_link(self, received: "DeviceEnvelope", me: str, deadline: Optional[float],
                   options: Optional[dict] = None):
        """The device link to receive ``received.src``'s tensors on, dialing the sender when it asks.

        A link is configured once, when it is set up (as RLinf sets a pair's
        group up once): with the sender's tuning fields, completed by this
        side's.  A transport that declares no fields is never given any.
        """
        import json

        with self._cond:
            link = self._in.get(received.src)
        if link is None or received.fresh or not link.is_open():
            hello = json.dumps({"src": me}).encode()
            fields = {**(options or {}), **(getattr(received, "options", None) or {})}
            if fields:
                link = self.transport.connect(received.endpoint, hello, deadline, options=fields)
            else:
                link = self.transport.connect(received.endpoint, hello, deadline)
            with self._cond:
                old, self._in[received.src] = self._in.get(received.src), link
            if old is not None:
                old.close()
        return link

    def close(self) -> None:
        with self._cond:
            links = list(self._out.values()) + list(self._in.values())
            self._out.clear()
            self._in.clear()
        for link in links:
            link.close()
        self.transport.close()

_routers: dict = {}
_routers_lock = threading.Lock()


def router(device: str = "cuda", transport: Optional[str] = None) -> DeviceRouter:
    """The process-wide router for ``device`` (default transport: the usable one with the highest priority)."""
    with _routers_lock:
        key = (device, transport)
        r = _routers.get(key)
        if r is None:
            r = _routers[key] = DeviceRouter(transport, device)
        return r


def close_routers() -> None:
    """Close every router of this process (with the communicator, when a worker is released)."""
    with _routers_lock:
        routers = list(_routers.values())
        _routers.clear()
    for r in routers:
        r.close()

__all__ = ["DeviceEnvelope", "DeviceRouter", "DeviceSlot", "close_routers", "materialize", "needs_device_path",
           "recv_object", "router", "send_object", "split"]
