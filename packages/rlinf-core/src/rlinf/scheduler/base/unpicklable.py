"""Saying which part of an object cannot be pickled, and where it was going.

Everything that crosses processes (a channel item, a ``send``, a group call's
arguments) is pickled.  When that fails, pickle names only a type (``cannot
pickle '_thread.lock' object``); the user has to guess which field of which
object it was.  ``unpicklable_error`` walks the object (dict values, list,
tuple and set items, attributes and slots) to the innermost part that does
not pickle, and builds a ``TypeError`` that names what was being sent, the
path to that part and what to do.  The walk runs only after a failure, visits
at most ``MAX_NODES`` parts and never pickles an array or tensor (they always
pickle), so it costs nothing on the path that works.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Optional

import cloudpickle

#: parts visited at most while looking for the one that does not pickle
MAX_NODES = 2000
#: how a launcher's reason for a rejected call begins when the method ran and its return value could not be
#: pickled (not a call that could not start)
RETURN_UNPICKLABLE = "the method ran, but "


class UnpicklableError(TypeError):
    """An object to be sent to another process cannot be pickled.

    A ``TypeError``, as pickle's own error is.

    Args:
        message: what could not be sent, and why.
        path: where the part that does not pickle sits in the object
            (``"item['state'].lock"``), or ``None`` when no single part could be
            named; kept as ``path``.
    """

    def __init__(self, message: str, path: Optional[str] = None):
        super().__init__(message)
        self.path = path


def _children(obj: Any) -> Iterator[tuple[str, Any]]:
    """``(path suffix, part)`` of the parts pickle would visit in ``obj``."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"[{key!r}]", value
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield f"[{i}]", value
    elif isinstance(obj, (set, frozenset)):
        for value in obj:
            yield "{...}", value
    else:
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            for field in dataclasses.fields(obj):
                if hasattr(obj, field.name):
                    yield f".{field.name}", getattr(obj, field.name)
            return
        state = getattr(obj, "__dict__", None)
        if isinstance(state, dict):
            yield from ((f".{name}", value) for name, value in state.items())
        for klass in type(obj).__mro__:
            for name in getattr(klass, "__slots__", ()):
                if isinstance(name, str) and hasattr(obj, name) and name not in ("__dict__", "__weakref__"):
                    yield f".{name}", getattr(obj, name)


def _always_pickles(obj: Any) -> bool:
    kind = type(obj)
    return kind.__module__ in ("torch", "numpy") or kind.__name__ in ("Tensor", "ndarray") or \
        isinstance(obj, (int, float, str, bytes, bool, type(None)))


def find_unpicklable(obj: Any, root: str = "", dumps: Callable = cloudpickle.dumps) -> Optional[tuple[str, Any]]:
    """``(path, part)`` of the innermost part of ``obj`` that ``dumps`` refuses, or None if none is found."""
    budget = [MAX_NODES]

    def fails(part) -> bool:
        if _always_pickles(part) or budget[0] <= 0:
            return False
        budget[0] -= 1
        try:
            dumps(part)
            return False
        except RecursionError:  # too deep to tell: not the part to name
            return False
        except Exception:
            return True

    if not fails(obj):
        return None
    path, part = root, obj
    while True:
        for suffix, child in _children(part):
            if fails(child):
                path, part = path + suffix, child
                break
        else:
            return path, part


def unpicklable_error(what: str, obj: Any, exc: BaseException, root: str = "") -> UnpicklableError:
    """The error to raise when pickling ``obj`` (``what``: e.g. "the item put on channel 'c' (key 'k')")
    failed with ``exc``: it names ``what``, the path to the part that cannot be pickled, and the fix."""
    found = find_unpicklable(obj, root)
    hint = ("only picklable values can cross processes: send the data it holds (plain values, tensors, arrays), "
            "or give its class __getstate__/__reduce__")
    if found is None:
        return UnpicklableError(f"cannot pickle {what}: {type(exc).__name__}: {exc} ({hint})")
    path, part = found
    kind = type(part)
    where = f"{path} " if path else ""
    return UnpicklableError(
        f"cannot pickle {what}: {where}is a {kind.__module__}.{kind.__qualname__}, which cannot be pickled "
        f"({type(exc).__name__}: {exc}); {hint}", path or None)
