"""The message format: any picklable object, with tensors carried out of band.

``encode`` pickles an object with protocol 5.  Every torch tensor and numpy
array inside it (at any depth: lists, dicts, dataclasses, user objects) is
replaced by a small record (dtype, shape, device) and its bytes go out of
band as a separate buffer, never through the pickler.  ``decode`` rebuilds
the object around the received buffers without copying them.

What arrives is exactly what was sent, bit for bit, with these rules:

* dtypes, shapes and values are exact (NaN payloads included); a numpy
  array keeps its full dtype (structured fields, byte order, datetime unit,
  metadata); an object array, or one whose dtype is not plain bytes
  (``StringDType``), travels through numpy's own pickling.
* a tensor keeps its class (``nn.Parameter``, ``nn.Buffer``, other
  subclasses), ``requires_grad``, its attributes (``__dict__``) and device.
  It arrives as a leaf: autograd history and ``.grad`` stay behind (as with
  ``torch.save``); conjugate and negative views arrive resolved.
* memory layout is not kept: each array or tensor arrives as its own
  contiguous block (row-major; a Fortran-ordered numpy array stays
  Fortran-ordered).  So a non-contiguous or negatively strided view arrives
  as a compact copy with the same values, and two different views of one
  base arrive as two independent arrays.  The same object sent twice in one
  message arrives as one object (pickle's memo).
* sparse, quantized, nested and meta tensors use torch's own pickling.

Core owns this format; transports only move the resulting buffers.
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any, Callable, Optional, Union

import cloudpickle

from ..base.unpicklable import UnpicklableError, unpicklable_error
from ..base.serialization import keep_own_classes  # noqa: F401  (received classes resolve to ours untouched)
from ..base.serialization import ship_run_time_modules_by_value

_TORCH = "torch"
#: numpy dtype kinds whose items are plain bytes (no pointers): these go out of band
_RAW_KINDS = frozenset("biufcmMSUV")


def _torch():
    return sys.modules.get(_TORCH)


_ndarray_type = None  # numpy.ndarray once numpy is imported: no object can be one before that


def _ndarray():
    """numpy is imported lazily (a worker that never sends an array starts without it, about 0.3 s faster)."""
    global _ndarray_type
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        _ndarray_type = numpy.ndarray
    return _ndarray_type


_torch_dtypes: dict = {}  # name -> torch dtype


def _rebuild_tensor(dtype_name: str, shape: tuple, device: str, requires_grad: bool, buf) -> Any:
    import torch

    dtype = _torch_dtypes.get(dtype_name) or _torch_dtypes.setdefault(dtype_name, getattr(torch, dtype_name))
    if memoryview(buf).nbytes == 0:
        tensor = torch.empty(shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(buf, dtype=dtype).reshape(shape)
    if device != "cpu":
        tensor = _to_device(tensor, device)
    if requires_grad:
        tensor.requires_grad_(True)
    return tensor


def _rebuild_tensor_as(kind: type, state: Optional[dict], requires_grad: bool, dtype_name: str, shape: tuple, device: str, buf):
    """A tensor subclass (``nn.Parameter``...) or a tensor with attributes."""
    import torch

    tensor = _rebuild_tensor(dtype_name, shape, device, False, buf)
    if issubclass(kind, torch.nn.Parameter):
        tensor = kind(tensor, requires_grad)
    else:
        if kind is not torch.Tensor:
            tensor = tensor.as_subclass(kind)
        if requires_grad:
            tensor.requires_grad_(True)
    if state:
        tensor.__dict__.update(state)
    return tensor


def _to_device(tensor, device: str):
    """Put a tensor back on its device; a device this process lacks is an error, not a silent CPU tensor."""
    try:
        return tensor.to(device)
    except Exception as exc:
        raise RuntimeError(f"received a tensor for device {device!r}, which this process cannot use: {exc}") from exc


def _rebuild_ndarray(dtype, shape: tuple, buf) -> np.ndarray:
    import numpy as np

    raw = buf if isinstance(buf, np.ndarray) else np.frombuffer(buf, dtype=np.uint8)
    return raw.view(np.dtype(dtype)).reshape(shape)


def _rebuild_ndarray_f(dtype, shape: tuple, buf) -> np.ndarray:
    """A Fortran-ordered array: its bytes are those of its (C-ordered) transpose."""
    return _rebuild_ndarray(dtype, shape[::-1], buf).T


def tensor_bytes(tensor) -> memoryview:
    """A zero-copy byte view of a contiguous CPU tensor."""
    if tensor.numel() == 0:
        return memoryview(b"")
    if tensor.dtype in (_NUMPY_FRIENDLY or _numpy_friendly()) and not tensor.requires_grad and tensor.dim():
        try:
            return memoryview(tensor.numpy()).cast("B")  # the fastest way for the common dtypes
        except (TypeError, ValueError):  # a layout numpy does not call contiguous
            pass
    flat = tensor.detach().reshape(-1)
    if flat.stride(0) != 1:  # one element whose (meaningless) stride is not 1
        flat = flat.as_strided((1,), (1,))
    try:
        return memoryview(flat.view(_torch().uint8).numpy())
    except (RuntimeError, TypeError):  # dtypes numpy cannot view directly
        return memoryview(flat.numpy()).cast("B")


_dtype_names: dict = {}
_NUMPY_FRIENDLY: frozenset = frozenset()


def _numpy_friendly() -> frozenset:
    """The torch dtypes ``Tensor.numpy`` supports (computed once torch is imported)."""
    global _NUMPY_FRIENDLY
    torch = _torch()
    _NUMPY_FRIENDLY = frozenset(getattr(torch, n) for n in ("float16", "float32", "float64", "int8", "int16", "int32",
                                                            "int64", "uint8", "bool", "complex64", "complex128"))
    return _NUMPY_FRIENDLY


def _dtype_name(dtype) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype).rsplit(".", 1)[-1]
    return name


def _reduce_ndarray(arr: np.ndarray):
    import numpy as np

    dtype = arr.dtype
    if dtype.kind not in _RAW_KINDS or dtype.hasobject or dtype.itemsize == 0:
        return NotImplemented  # numpy's own pickling
    # the dtype travels as its short string when that string rebuilds it exactly
    desc = dtype.str if dtype.names is None and dtype.metadata is None else dtype
    shape = arr.shape
    if arr.flags.c_contiguous:
        rebuild = _rebuild_ndarray
    elif arr.flags.f_contiguous:
        rebuild, arr = _rebuild_ndarray_f, arr.T
    else:
        rebuild, arr = _rebuild_ndarray, np.ascontiguousarray(arr)
    return rebuild, (desc, shape, pickle.PickleBuffer(arr.reshape(-1).view(np.uint8)))


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, so that classes defined in ``__main__`` or a test module (which
    exist by value in worker processes) can travel too; tensors go out of band."""

    def __init__(self, file, buffers: list, device_hook: Optional[Callable]):
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self._device_hook = device_hook

    def reducer_override(self, obj):
        kind = type(obj)
        if kind is (_ndarray_type or _ndarray()):
            return _reduce_ndarray(obj)
        torch = _torch()
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._reduce_tensor(obj, torch)
        return super().reducer_override(obj)

    def _reduce_tensor(self, tensor, torch):
        if tensor.layout != torch.strided or tensor.is_quantized or tensor.is_nested or tensor.is_meta:
            return NotImplemented  # rare kinds: torch's own pickling
        kind = type(tensor)
        state = tensor.__dict__ or None
        requires_grad = tensor.requires_grad
        cpu = tensor.detach()
        if kind is not torch.Tensor:
            cpu = cpu.as_subclass(torch.Tensor)
        if cpu.is_cpu:
            device = "cpu"
        else:
            device = str(cpu.device)
            if self._device_hook is not None and kind is torch.Tensor and state is None:
                handled = self._device_hook(tensor)
                if handled is not None:
                    return handled
            cpu = cpu.cpu()
        if cpu.is_conj():
            cpu = cpu.resolve_conj()
        if cpu.is_neg():
            cpu = cpu.resolve_neg()
        if not cpu.is_contiguous():
            cpu = cpu.contiguous()
        args = (_dtype_name(cpu.dtype), tuple(cpu.shape), device)
        buf = pickle.PickleBuffer(tensor_bytes(cpu))
        if kind is torch.Tensor and state is None:
            return _rebuild_tensor, (*args, requires_grad, buf)
        return _rebuild_tensor_as, (kind, state, requires_grad, *args, buf)


_SCALARS = frozenset((str, int, float, bool, type(None), complex))
#: scalars with no size to check
_FLAT = frozenset((int, float, bool, type(None), complex))
#: plain data bigger than this goes through the full pickler (large bytes travel out of band there)
_PLAIN_LIMIT = 64
#: str/bytes longer than this are not plain
_PLAIN_TEXT = 4096


def _is_plain(obj, depth: int = 0) -> bool:
    """Small builtin data (scalars, short str/bytes, small lists/tuples/dicts of them, at most 3 deep).

    The walk is bounded: at most ``_PLAIN_LIMIT`` items per container, and it stops at the first
    item that is not plain."""
    kind = type(obj)
    if kind in _FLAT:
        return True
    if kind is str or kind is bytes:
        return len(obj) <= _PLAIN_TEXT
    if depth >= 3:
        return False
    if kind is dict:
        if len(obj) > _PLAIN_LIMIT:
            return False
        scalars = _SCALARS
        for key in obj:
            if type(key) not in scalars:
                return False
        values = obj.values()
    elif kind is list or kind is tuple:
        if len(obj) > _PLAIN_LIMIT:
            return False
        values = obj
    else:
        return False
    flat = _FLAT
    for value in values:
        kind = type(value)
        if kind in flat:
            continue
        if kind is str or kind is bytes:
            if len(value) > _PLAIN_TEXT:
                return False
        elif not _is_plain(value, depth + 1):
            return False
    return True


def encode(obj: Any, device_hook: Optional[Callable] = None, what: Union[str, Callable[[], str]] = "the object",
           root: str = "") -> tuple[bytes, list]:
    """Pickle ``obj``; return the pickle stream and the out-of-band buffers.

    ``what`` names the object in errors: a str, or a callable returning one (called only when
    encoding fails, so a caller need not build the text for every message).

    Raises ``UnpicklableError`` (a ``TypeError``) naming ``what`` and the path (from ``root``) to the
    part of ``obj`` that cannot be pickled."""
    try:
        if _is_plain(obj):  # the common small message: the C pickler alone is several times faster
            return pickle.dumps(obj, 5), []
        ship_run_time_modules_by_value()  # a test module's classes cannot be imported by the receiver
        buffers: list = []
        stream = io.BytesIO()
        _Pickler(stream, buffers, device_hook).dump(obj)
    except (TypeError, AttributeError, pickle.PicklingError) as exc:  # what pickle raises for an unpicklable part
        if isinstance(exc, UnpicklableError):
            raise
        raise unpicklable_error(what if isinstance(what, str) else what(), obj, exc, root) from exc
    return stream.getvalue(), [b.raw() for b in buffers]


def decode(header, buffers: list) -> Any:
    """Rebuild the object; buffers are used in place (no copy)."""
    return pickle.loads(header, buffers=buffers) if buffers else pickle.loads(header)
