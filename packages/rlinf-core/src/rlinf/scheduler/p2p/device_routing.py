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

The communicator routes through here with one call per direction (see
``send_object`` / ``recv_object`` below); this module only needs the two
CPU-path callables and the pair's device link.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional


@dataclasses.dataclass(frozen=True)
class DeviceSlot:
    """Where a device tensor was; the receiver allocates one like it on its own device."""

    index: int
    shape: tuple
    dtype: str
    requires_grad: bool = False


def _is_tensor(x) -> bool:
    import sys

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
        from ..accelerator import current

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


__all__ = ["DeviceSlot", "split", "materialize", "send_object", "recv_object", "needs_device_path"]
