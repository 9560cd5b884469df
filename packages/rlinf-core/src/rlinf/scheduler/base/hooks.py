"""Hook points: the functions the timeline wraps while tracing is on.

A library function marked ``@hook("kind")`` is left exactly as it is: marking
costs nothing per call.  Turning tracing on (``install``) rebinds every marked
name, on its module or class, to a recording wrapper made by the recorder;
turning it off (``uninstall``) puts the original back.  So tracing that is
off costs nothing at all, not even a flag test, on the hot paths it covers
(a group call, a p2p message, a channel operation, a timer).

This module imports nothing of rlinf, so any module may mark its functions.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, Optional

#: (original function, kind) for every marked function, in import order
_points: list = []
#: ``factory(kind, fn) -> wrapper`` while tracing is on in this process, else None
_factory: Optional[Callable] = None
_lock = threading.Lock()


def hook(kind: str) -> Callable:
    """Mark a module-level function or a method (defined directly in a module-level class) as a hook point."""

    def mark(fn):
        with _lock:
            _points.append((fn, kind))
            factory = _factory
        if factory is not None:  # the module is imported while tracing is on already
            return factory(kind, fn)
        return fn

    return mark


def _owner(fn) -> tuple:
    """The module or class that holds ``fn`` under its name."""
    owner = sys.modules[fn.__module__]
    parts = fn.__qualname__.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]


def install(factory: Callable) -> None:
    """Rebind every hook point to ``factory(kind, original)``."""
    global _factory
    with _lock:
        _factory = factory
        points = list(_points)
    # outside the lock: a factory may import, and an import in another thread may be waiting in ``hook``
    for fn, kind in points:
        try:
            owner, name = _owner(fn)
        except (KeyError, AttributeError):  # its module is still being imported: the decorator wraps it
            continue
        setattr(owner, name, factory(kind, fn))


def uninstall() -> None:
    """Put every original back."""
    global _factory
    with _lock:
        _factory = None
        points = list(_points)
    for fn, _kind in points:
        try:
            owner, name = _owner(fn)
        except (KeyError, AttributeError):
            continue
        setattr(owner, name, fn)


def installed() -> bool:
    return _factory is not None
