"""What a broadcast carries: the object as a codec header and buffers, and their layout.

``encode`` turns the source's object into a ``_Payload``: the codec header,
its buffers, and for a tensor or a dict, list or tuple of CPU tensors a
description of each tensor (key, dtype, shape), sent before any data so a
receiver with ``out=`` can check its containers first (``broadcast_out``).
``_layout`` places the buffers in a shared-memory segment (``broadcast_shm``).

Like MPI's eager and rendezvous protocols, a small payload (at most
``RLINF_BROADCAST_EAGER_KB``, default 1024) is copied (``_eager_payload``)
and served in the background, so the source returns at once.
"""

from __future__ import annotations

import os
import pickle
import sys
from dataclasses import dataclass
from typing import Any, Optional

from ...transports import codec
from .broadcast_plan import _chunk_bytes

EAGER_ENV = "RLINF_BROADCAST_EAGER_KB"
_ALIGN = 64


@dataclass
class _Payload:
    meta: dict
    buffers: list  # memoryviews, in codec order


def _tensor_items(obj) -> Optional[tuple[str, list]]:
    """``(container, [(key, tensor)])`` for a tensor or a non-empty dict/list/tuple of CPU tensors."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if isinstance(obj, torch.Tensor):
        container, items = "tensor", [(None, obj)]
    elif isinstance(obj, dict) and obj:
        container, items = "dict", list(obj.items())
    elif isinstance(obj, (list, tuple)) and obj:
        container, items = "list", list(enumerate(obj))
    else:
        return None
    for _k, t in items:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized:
            return None
    return container, items


def _describe(obj) -> str:
    return type(obj).__name__


def encode(obj: Any) -> _Payload:
    """The object as a codec header plus buffers, and for tensor containers a per-key description."""
    header, buffers = codec.encode(obj)
    buffers = [memoryview(b).cast("B") for b in buffers]
    meta = {"form": "object", "header": header, "sizes": [b.nbytes for b in buffers], "entries": None,
            "what": _describe(obj), "chunk": _chunk_bytes()}
    found = _tensor_items(obj)
    if found is not None:
        container, items = found
        index: dict[int, int] = {}
        entries = []
        for key, t in items:
            i = index.setdefault(id(t), len(index))
            entries.append((key, i, codec._dtype_name(t.dtype), tuple(t.shape)))
        sizes = meta["sizes"]
        nbytes = {i: t.numel() * t.element_size() for (_k, t), (_k2, i, _d, _s) in zip(items, entries)}
        if len(sizes) == len(index) and all(sizes[i] == n for i, n in nbytes.items()):
            meta.update(form="tensors", container=container, entries=entries)
    return _Payload(meta, buffers)


def _dumps(meta: dict) -> bytes:
    try:
        return pickle.dumps(meta, protocol=5)
    except Exception:  # keys of a class pickle cannot name
        import cloudpickle

        return cloudpickle.dumps(meta, protocol=5)


def _eager_bytes() -> int:
    return max(0, int(float(os.environ.get(EAGER_ENV, "1024")) * 1024))


def _eager_payload(obj) -> Optional[_Payload]:
    """The payload, copied, when it is small enough to serve after the source returned; else None."""
    payload = encode(obj)
    if sum(b.nbytes for b in payload.buffers) > _eager_bytes():
        return None
    return _Payload(payload.meta, [memoryview(bytes(b)) for b in payload.buffers])


def _layout(sizes: list) -> tuple[list, int]:
    offsets, pos = [], 0
    for n in sizes:
        offsets.append(pos)
        pos += -(-n // _ALIGN) * _ALIGN
    return offsets, pos
