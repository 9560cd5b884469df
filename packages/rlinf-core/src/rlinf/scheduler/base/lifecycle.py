"""The process lifecycle: registration points for what higher layers hold in a process.

A worker process may host one worker after another (an MPI rank does): when
its worker is released, every layer lets go of what it holds, though the
host that releases it knows none of them.  Each layer registers here instead,
as ``atexit`` callers do:

* ``on_release_start(fn)``: runs first, while the worker object still exists
  (the groups it launched stop; it may hold the only reference to them);
* ``on_release(fn)``: runs after the worker object is dropped, the last
  registered first, so that a higher layer (channels, registered when they are
  imported) lets go before the layer under it (the connections they use).

A callback that raises is reported on stderr and the others still run: a
release has no caller left to raise to.  This module imports nothing of rlinf.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable

_lock = threading.Lock()
_at_start: list = []
_at_release: list = []


def on_release_start(fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn()`` when this process's worker starts being released (registration order)."""
    with _lock:
        if fn not in _at_start:
            _at_start.append(fn)
    return fn


def on_release(fn: Callable[[], None]) -> Callable[[], None]:
    """Run ``fn()`` once this process's worker object is dropped (last registered first)."""
    with _lock:
        if fn not in _at_release:
            _at_release.append(fn)
    return fn


def _run(callbacks: list) -> None:
    for fn in callbacks:
        try:
            fn()
        except Exception as exc:  # the others still run
            print(f"rlinf: releasing the worker: {getattr(fn, '__qualname__', fn)} raised "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)


def release_start() -> None:
    """Run the ``on_release_start`` callbacks."""
    with _lock:
        callbacks = list(_at_start)
    _run(callbacks)


def release() -> None:
    """Run the ``on_release`` callbacks, the last registered first."""
    with _lock:
        callbacks = list(reversed(_at_release))
    _run(callbacks)
