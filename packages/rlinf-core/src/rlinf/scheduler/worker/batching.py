"""Batches cut into shards and joined again along their first dimension, for routed sends.

A *batch* is one of:

- a ``torch.Tensor`` or ``numpy.ndarray``: its first dimension is the batch;
- a ``list``: its items are the batch;
- a ``dict``: each value is a batch of the same size, or ``None`` (kept as ``None`` in
  every shard);
- a dataclass instance: its fields, like a dict's values (RLinf handles dicts only;
  here a dataclass splits and merges field by field and keeps its class).

Structures nest: a dict of dicts of tensors, a dataclass holding a dict of lists.
Tuples and other objects are not batches (RLinf's rule): they cannot be split, and
merging them succeeds only when all shards hold an equal value.

``torch`` is optional for this project, so it is never imported here: a tensor can only
exist when ``torch`` is loaded already, and the tests for tensors look it up then.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from typing import Any, Callable, Optional, Sequence


class BatchSplitError(ValueError, RuntimeError):
    """Split sizes that do not fit the batch (negative, or not summing to its size).

    A ``ValueError`` like RLinf's other batch errors, and a ``RuntimeError`` like the
    error ``torch.split`` raises there for tensors.
    """


def _tensor_type():
    torch = sys.modules.get("torch")
    return getattr(torch, "Tensor", None) if torch is not None else None


def _is_tensor(data: Any) -> bool:
    tensor = _tensor_type()
    return tensor is not None and isinstance(data, tensor)


def _is_ndarray(data: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(data, np.ndarray)


def _is_dataclass_instance(data: Any) -> bool:
    return dataclasses.is_dataclass(data) and not isinstance(data, type)


def _members(data: Any) -> list[tuple[str, Any]]:
    """``(name, value)`` of a dict's items or a dataclass's fields."""
    if isinstance(data, dict):
        return list(data.items())
    return [(f.name, getattr(data, f.name)) for f in dataclasses.fields(data)]


def _rebuild(template: Any, values: dict) -> Any:
    """A copy of the dataclass ``template`` with ``values`` for its fields (frozen ones too).

    The copy skips ``__init__`` and ``__post_init__``: the values are shards of fields
    that were initialised already.
    """
    out = copy.copy(template)
    for name, value in values.items():
        object.__setattr__(out, name, value)
    return out


def infer_batch_size(data: Any) -> int:
    """The batch size of ``data``: the first dimension of a tensor/array, a list's length,
    or the batch size of a dict's (or dataclass's) first value that is not ``None``.

    Args:
        data: a batch (see the module's docstring).

    Raises:
        ValueError: ``data`` is not a batch, a 0-d tensor/array, or a dict/dataclass whose
            values are all ``None`` (or that has none).
    """
    if _is_tensor(data) or _is_ndarray(data):
        if data.ndim == 0:
            raise ValueError("Cannot infer batch size from a 0-d tensor or array.")
        return int(data.shape[0])
    if isinstance(data, list):
        return len(data)
    if isinstance(data, dict) or _is_dataclass_instance(data):
        first = next((value for _, value in _members(data) if value is not None), None)
        if first is None:
            kind = "dict" if isinstance(data, dict) else type(data).__name__
            raise ValueError(f"Cannot infer batch size from an all-None {kind} payload.")
        return infer_batch_size(first)
    raise ValueError(f"Unsupported payload type for batch-size inference: {type(data)}")


def _check_sizes(size: int, split_sizes: list[int]) -> None:
    if any(s < 0 for s in split_sizes):
        raise BatchSplitError(f"split sizes must not be negative, got {split_sizes}")
    if sum(split_sizes) != size:
        raise BatchSplitError(
            f"split sizes {split_sizes} sum to {sum(split_sizes)}, but the batch has {size} item(s)"
        )


def split_batch(data: Any, split_sizes: Sequence[int]) -> list[Any]:
    """Cut ``data`` along its batch dimension into ``len(split_sizes)`` shards, in order.

    Tensor shards are contiguous copies-or-views as ``torch.split(...).contiguous()``
    gives them; array shards are views; list shards are new lists of the same items;
    dict and dataclass shards hold the shards of each value (``None`` stays ``None``).

    Args:
        data: a batch (see the module's docstring).
        split_sizes: the number of items in each shard; they must sum to the batch size.

    Raises:
        ValueError: ``data`` (or a value inside it) is not a batch.
        BatchSplitError: a size is negative or the sizes do not sum to the batch size
            (a ``ValueError`` and a ``RuntimeError``).
    """
    sizes = [int(s) for s in split_sizes]
    if _is_tensor(data):
        _check_sizes(infer_batch_size(data), sizes)
        torch = sys.modules["torch"]
        return [chunk.contiguous() for chunk in torch.split(data, sizes, dim=0)]
    if _is_ndarray(data):
        _check_sizes(infer_batch_size(data), sizes)
        shards, begin = [], 0
        for size in sizes:
            shards.append(data[begin : begin + size])
            begin += size
        return shards
    if isinstance(data, list):
        _check_sizes(len(data), sizes)
        shards, begin = [], 0
        for size in sizes:
            shards.append(data[begin : begin + size])
            begin += size
        return shards
    if isinstance(data, dict) or _is_dataclass_instance(data):
        per_shard: list[dict] = [{} for _ in sizes]
        for name, value in _members(data):
            parts = [None] * len(sizes) if value is None else split_batch(value, sizes)
            for shard, part in zip(per_shard, parts):
                shard[name] = part
        if isinstance(data, dict):
            return per_shard
        return [_rebuild(data, values) for values in per_shard]
    raise ValueError(f"Unsupported payload type for batch split: {type(data)}")


def _all_equal(batches: Sequence[Any], first: Any) -> bool:
    try:
        return all(bool(batch == first) for batch in batches)
    except Exception:  # an ``==`` that gives no single truth value (arrays inside a tuple)
        return False


def merge_batches(batches: Sequence[Any]) -> Any:
    """Join shards along their batch dimension: the inverse of ``split_batch``.

    One shard comes back as it is; shards that are all ``None`` give ``None``. Tensors
    are concatenated (``torch.cat``), arrays too (``numpy.concatenate``), lists joined,
    dicts and dataclasses merged value by value (the first shard's keys, and its class
    for dataclasses). Other values merge only if all shards hold an equal one, which
    is returned.

    Args:
        batches: the shards, in order.

    Raises:
        ValueError: no shards; some shards ``None`` and others not; shards of different
            kinds, dicts with different keys, or dataclasses of different classes; or
            unequal values that are not batches.
    """
    if len(batches) == 0:
        raise ValueError("Cannot merge an empty batch list.")
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    if all(batch is None for batch in batches):
        return None
    if any(batch is None for batch in batches):
        raise ValueError("Cannot merge a mix of None and non-None payloads generically.")

    if _is_tensor(first):
        if not all(_is_tensor(b) for b in batches):
            raise ValueError("Cannot merge tensors with payloads that are not tensors.")
        return sys.modules["torch"].cat(list(batches), dim=0)
    if _is_ndarray(first):
        if not all(_is_ndarray(b) for b in batches):
            raise ValueError("Cannot merge numpy arrays with payloads that are not arrays.")
        return sys.modules["numpy"].concatenate(list(batches), axis=0)
    if isinstance(first, list):
        if not all(isinstance(b, list) for b in batches):
            raise ValueError("Cannot merge lists with payloads that are not lists.")
        merged: list[Any] = []
        for batch in batches:
            merged.extend(batch)
        return merged
    if isinstance(first, dict):
        if not all(isinstance(b, dict) and b.keys() == first.keys() for b in batches):
            raise ValueError(
                f"Cannot merge dicts with different keys: {[sorted(map(str, b)) if isinstance(b, dict) else type(b) for b in batches]}"
            )
        return {key: merge_batches([batch[key] for batch in batches]) for key in first}
    if _is_dataclass_instance(first):
        if not all(type(b) is type(first) for b in batches):
            raise ValueError(
                f"Cannot merge {type(first).__name__} with {[type(b).__name__ for b in batches]}"
            )
        values = {
            f.name: merge_batches([getattr(batch, f.name) for batch in batches])
            for f in dataclasses.fields(first)
        }
        return _rebuild(first, values)
    if _all_equal(batches, first):
        return first
    raise ValueError(f"Unsupported payload type for batch merge: {type(first)}")


def get_batch_size(data: Any, infer_batch_size_fn: Optional[Callable[[Any], int]] = None) -> int:
    """The batch size of ``data``, by ``infer_batch_size_fn`` if given, else ``infer_batch_size``.

    Args:
        data: the payload.
        infer_batch_size_fn: a custom ``data -> int`` for payloads ``infer_batch_size``
            does not know.

    Raises:
        ValueError: as ``infer_batch_size`` (or whatever the custom function raises).
    """
    if infer_batch_size_fn is None:
        return infer_batch_size(data)
    return infer_batch_size_fn(data)


def validate_batch_size(
    data: Any,
    expected_batch_size: Optional[int],
    infer_batch_size_fn: Optional[Callable[[Any], int]] = None,
) -> None:
    """Check that ``data`` holds ``expected_batch_size`` items; ``None`` skips the check.

    Args:
        data: a received shard.
        expected_batch_size: what the route plan says it holds.
        infer_batch_size_fn: as in ``get_batch_size``.

    Raises:
        ValueError: the sizes differ, or the size cannot be inferred.
    """
    if expected_batch_size is None:
        return
    actual = get_batch_size(data, infer_batch_size_fn)
    if actual != expected_batch_size:
        raise ValueError(f"Expected batch size {expected_batch_size}, but received {actual}.")
