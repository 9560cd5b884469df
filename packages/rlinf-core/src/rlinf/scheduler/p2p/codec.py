"""The message format: any picklable object, with tensors carried out of band.

``encode`` pickles an object with protocol 5.  Every torch tensor and numpy
array inside it (at any depth: lists, dicts, dataclasses, user objects) is
replaced by a small record (dtype, shape, device) and its bytes go out of
band as a separate buffer, never through the pickler.  ``decode`` rebuilds
the object around the received buffers without copying them.

Core owns this format; transports only move the resulting buffers.
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any, Callable, Optional

import cloudpickle
import numpy as np

#: devices a tensor may be rebuilt on when the receiver has it; otherwise it stays on CPU
_TORCH = "torch"


def _torch():
    return sys.modules.get(_TORCH)


def _rebuild_tensor(dtype_name: str, shape: tuple, device: str, requires_grad: bool, buf) -> Any:
    import torch

    dtype = getattr(torch, dtype_name)
    raw = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    if raw.size == 0:
        tensor = torch.empty(shape, dtype=dtype)
    else:
        tensor = torch.from_numpy(raw).view(dtype).reshape(shape)
    if device != "cpu":
        tensor = _to_device(tensor, device)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


def _to_device(tensor, device: str):
    """Put a tensor back on its device; a device this process lacks is an error, not a silent CPU tensor."""
    try:
        return tensor.to(device)
    except Exception as exc:
        raise RuntimeError(f"received a tensor for device {device!r}, which this process cannot use: {exc}") from exc


def _rebuild_ndarray(dtype: str, shape: tuple, buf) -> np.ndarray:
    raw = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    return raw.view(np.dtype(dtype)).reshape(shape)


def tensor_bytes(tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor."""
    if tensor.numel() == 0:
        return memoryview(b"")
    flat = tensor.detach().reshape(-1)
    try:
        return memoryview(flat.view(_torch().uint8).numpy())
    except (RuntimeError, TypeError):  # dtypes numpy cannot view directly
        return memoryview(flat.numpy()).cast("B")


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, so that classes defined in ``__main__`` or a test module (which
    exist by value in worker processes) can travel too; tensors go out of band."""

    def __init__(self, file, buffers: list, device_hook: Optional[Callable]):
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self._device_hook = device_hook

    def reducer_override(self, obj):
        torch = _torch()
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._reduce_tensor(obj, torch)
        if type(obj) is np.ndarray and obj.dtype.hasobject is False:
            arr = np.ascontiguousarray(obj)
            return _rebuild_ndarray, (arr.dtype.str, arr.shape, pickle.PickleBuffer(arr.reshape(-1).view(np.uint8)))
        return super().reducer_override(obj)

    def _reduce_tensor(self, tensor, torch):
        if tensor.is_sparse or tensor.layout != torch.strided:
            return NotImplemented  # rare layouts: torch's own pickling
        device = str(tensor.device)
        cpu = tensor.detach()
        if cpu.device.type != "cpu":
            if self._device_hook is not None:
                handled = self._device_hook(tensor)
                if handled is not None:
                    return handled
            cpu = cpu.cpu()
        cpu = cpu.contiguous()
        dtype_name = str(cpu.dtype).rsplit(".", 1)[-1]
        return _rebuild_tensor, (dtype_name, tuple(cpu.shape), device, bool(tensor.requires_grad), pickle.PickleBuffer(tensor_bytes(cpu)))


_SCALARS = frozenset((str, int, float, bool, type(None), complex))
#: plain data bigger than this goes through the full pickler (large bytes travel out of band there)
_PLAIN_LIMIT = 64


def _is_plain(obj, depth: int = 0) -> bool:
    """Small builtin data (scalars, short str/bytes, small lists/tuples/dicts of them)."""
    kind = type(obj)
    if kind in _SCALARS:
        return kind is not str or len(obj) <= 4096
    if kind is bytes:
        return len(obj) <= 4096
    if depth >= 3:
        return False
    scalars = _SCALARS
    if kind is dict:
        if len(obj) > _PLAIN_LIMIT:
            return False
        for key, value in obj.items():
            if type(key) not in scalars:
                return False
            if (type(value) not in scalars or type(value) is str) and not _is_plain(value, depth + 1):
                return False
        return True
    if kind is list or kind is tuple:
        if len(obj) > _PLAIN_LIMIT:
            return False
        for value in obj:
            if (type(value) not in scalars or type(value) is str) and not _is_plain(value, depth + 1):
                return False
        return True
    return False


def encode(obj: Any, device_hook: Optional[Callable] = None) -> tuple[bytes, list]:
    """Pickle ``obj``; return the pickle stream and the out-of-band buffers."""
    if _is_plain(obj):  # the common small message: the C pickler alone is several times faster
        return pickle.dumps(obj, protocol=5), []
    buffers: list = []
    stream = io.BytesIO()
    _Pickler(stream, buffers, device_hook).dump(obj)
    return stream.getvalue(), [b.raw() for b in buffers]


def decode(header, buffers: list) -> Any:
    """Rebuild the object; buffers are used in place (no copy)."""
    return pickle.loads(header, buffers=buffers) if buffers else pickle.loads(header)
