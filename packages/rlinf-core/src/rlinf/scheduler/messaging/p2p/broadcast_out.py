"""Receiving into ``out=``: checking the receiver's tensors, copying into them, or moving them onto the segment.

``out=`` receives in place: the source describes each tensor (key, dtype,
shape) before any data (``broadcast_payload``), and a receiver checks its
containers against that description before it writes a byte
(``_targets_for_out``).  A mismatch is refused with an error naming the key;
the receiver still relays the payload to its successor.

A receiver on the source's host with ``out=`` and ``share_memory=True``
copies nothing: it moves the storages behind its tensors onto the segment
(``_share``; its kept shared mapping of it), and the segment is lent to it
(``broadcast_lending``), as to views, until no storage of it is on that
segment (the next broadcast moves them to another one).  A copy into such a
tensor would write memory other receivers read, so it is given private
memory first (``_unshare``).
"""

from __future__ import annotations

import sys
import weakref
from typing import TYPE_CHECKING, Any

from ...transports import codec
from .broadcast_payload import _describe, _tensor_items, encode

if TYPE_CHECKING:
    from .broadcast_lending import _Segments


def _out_name(container: str, key) -> str:
    """How messages name one tensor of ``out``."""
    return "out=" if container == "tensor" else f"out[{key!r}]"


def _targets_for_out(out, meta: dict, me: str, private: bool = True) -> list:
    """For each buffer, the byte views of the ``out`` tensors it fills; raises before anything is written.

    ``private``: tensors on a shared segment get private memory first (``_unshare``), once all are checked:
    a copy into them must not reach the other receivers."""
    import numpy as np  # imported here: a process that never broadcasts does not load it
    torch = sys.modules.get("torch")
    entries = meta.get("entries")
    if entries is None:
        raise ValueError(f"{me}: broadcast(out=...) needs the source to broadcast a tensor, or a dict, list or tuple "
                         f"of CPU tensors; it broadcast a {meta.get('what')}")
    container = meta["container"]
    if container == "dict":
        if not isinstance(out, dict):
            raise TypeError(f"{me}: broadcast(out=...): the source broadcast a dict of tensors, out= is a "
                            f"{type(out).__name__}")
        keys = [e[0] for e in entries]
        missing = [k for k in keys if k not in out]
        extra = [k for k in out if k not in set(keys)]
        if missing or extra:
            raise ValueError(f"{me}: broadcast(out=...): the keys differ from the source's: missing in out= "
                             f"{missing[:8]}, not sent by the source {extra[:8]}")
    elif container == "list":
        if not isinstance(out, (list, tuple)) or len(out) != len(entries):
            raise ValueError(f"{me}: broadcast(out=...): the source broadcast a list of {len(entries)} tensors, out= "
                             f"is a {type(out).__name__}"
                             f"{f' of {len(out)}' if isinstance(out, (list, tuple)) else ''}")
    targets: list = [[] for _ in meta["sizes"]]
    for key, i, dtype, shape in entries:
        t = out if container == "tensor" else out[key]
        name = _out_name(container, key)
        if torch is None or not isinstance(t, torch.Tensor):
            raise TypeError(f"{me}: broadcast: {name} is a {type(t).__name__}, not a tensor")
        if codec._dtype_name(t.dtype) != dtype or tuple(t.shape) != tuple(shape):
            raise ValueError(f"{me}: broadcast: {name} is a {tuple(t.shape)} {codec._dtype_name(t.dtype)} tensor, "
                             f"the source sent {tuple(shape)} {dtype}")
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"{me}: broadcast: {name} must be a contiguous CPU tensor")
        targets[i].append(np.frombuffer(codec.tensor_bytes(t), dtype=np.uint8) if t.numel() else None)
    if private and _unshare(out):  # moved: the byte views must be of their new memory
        return _targets_for_out(out, meta, me, private=False)
    return targets


def copy_into(obj: Any, out: Any, me: str) -> Any:
    """Copy a received object into ``out`` (the paths that did not receive into it directly)."""
    import numpy as np  # imported here: a process that never broadcasts does not load it
    meta = encode(obj).meta if _tensor_items(obj) is not None else {"entries": None, "what": _describe(obj),
                                                                       "sizes": []}
    targets = _targets_for_out(out, meta, me)
    for (key, i, _d, _s) in meta["entries"]:
        src = obj if meta["container"] == "tensor" else obj[key]
        if src.numel():
            src_bytes = np.frombuffer(codec.tensor_bytes(src.contiguous()), dtype=np.uint8)
            for dst in targets[i]:
                np.copyto(dst, src_bytes)
    return out


# -- receivers that share memory ------------------------------------------------------------------
#: the segments (one marker per lending) that tensors of this process were moved onto: a copy into such a
#: tensor would write memory other receivers read, so it is given private memory first (``_unshare``)
_SHARED: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()  # id -> marker (ctypes: unhashable)
_warned: set = set()


def _shared_ranges() -> list:
    """``(start, end)`` addresses of the segments tensors of this process were moved onto."""
    return [(m.lo, m.hi) for m in list(_SHARED.values())]


def _can_move(t, nbytes: int) -> bool:
    """Whether ``t``'s storage can be moved whole onto ``nbytes`` of the segment: ``t`` is all of its storage.

    Moving the storage, not re-pointing the tensor, is what reaches every alias of it: ``model.state_dict()``
    returns detached aliases of the parameters, and the parameters must see the new weights."""
    storage = t.untyped_storage()
    return (t.numel() > 0 and t.storage_offset() == 0 and t.is_contiguous() and storage.nbytes() == nbytes
            and hasattr(storage, "_swap_data_ptr_"))


def _share(out, meta: dict, mapping, offsets: list, state: _Segments, feeder: str, me: str) -> tuple[list, bool]:
    """Move the storage of each tensor of ``out`` onto its bytes in the segment ``mapping``.

    Returns ``([(buffer index, tensor)] still to be copied, whether any moved)``.  Every alias of a moved
    storage (a model's parameter behind its ``state_dict()`` entry) reads the new values; the old memory
    is freed with its last user.  The segment stays lent to this process (the source never writes it)
    until no storage here uses it: a marker object held by the moved storages reports it released."""
    import ctypes

    torch = sys.modules["torch"]
    sizes = meta["sizes"]
    container = meta["container"]
    marker = None
    left = []
    moved = False
    placed: set = set()  # buffers a storage was moved onto
    retired = []
    shared = _shared_ranges()
    for key, i, _dtype, _shape in meta["entries"]:
        t = out if container == "tensor" else out[key]
        if t.numel() == 0:
            continue
        where = ctypes.addressof(mapping) + offsets[i]
        if i in placed:
            if t.untyped_storage().data_ptr() != where:  # the source's tied buffer, two tensors here: kept apart
                left.append((i, t))
            continue  # else the same storage under another key (tied weights): moved already
        if not _can_move(t, sizes[i]):
            name = _out_name(container, key)
            if (me, name) not in _warned:
                _warned.add((me, name))
                import logging

                logging.getLogger("rlinf.broadcast").warning(
                    "%s: broadcast(share_memory=True) copies into %s: it is a view of a larger storage (or this "
                    "torch cannot move storages), so its memory cannot be shared", me, name)
            left.append((i, t))
            continue
        if marker is None:
            marker = (ctypes.c_char * ctypes.sizeof(mapping)).from_address(ctypes.addressof(mapping))
            marker.mapping = mapping  # the storages hold the marker, the marker holds the mapping
            marker.lo, marker.hi = ctypes.addressof(mapping), ctypes.addressof(mapping) + ctypes.sizeof(mapping)
            state.lend(feeder, meta.get("token"), marker)
            _SHARED[id(marker)] = marker
        region = torch.frombuffer(marker, dtype=torch.uint8, count=sizes[i], offset=offsets[i])
        old = t.untyped_storage().data_ptr()
        t.untyped_storage()._swap_data_ptr_(region.untyped_storage())  # its old memory goes with ``region``
        if not any(lo <= old < hi for lo, hi in shared):
            retired.append(region)  # private memory, freed at the next broadcast (a segment stays mapped)
        placed.add(i)
        moved = True
    with state.segment_lock:
        previous = state.retired.pop(feeder, None)
        if retired:
            state.retired[feeder] = retired
    del previous  # outside the lock: freeing it may run finalizers
    return left, moved


def _unshare(out) -> bool:
    """Give the tensors of ``out`` that live on a shared segment private memory (same values); True if any.

    Called before anything is copied into ``out``: other receivers read that segment."""
    if not _SHARED:
        return False
    ranges = _shared_ranges()
    torch = sys.modules["torch"]
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else [out]
    moved = False
    for t in values:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        where = storage.data_ptr()
        if any(lo <= where < hi for lo, hi in ranges):
            private = torch.empty(storage.nbytes(), dtype=torch.uint8).untyped_storage()
            private.copy_(storage)
            storage._swap_data_ptr_(private)
            moved = True
    return moved
