"""Spans a program marks itself (RLinf's ``Tracer.trace_begin`` / ``trace_end``), on the timeline.

``begin(name, cat, args)`` opens a span on the calling thread (or, inside an
``asyncio`` task, on that task: tasks of one loop interleave, so their spans
are async slices with a track of their own); ``end(name)`` closes the last
open span of that name and records it in the process's buffer
(``recorder.record``) with category ``cat``, beside the worker's calls,
timers and messages.  While tracing is off in the process both do nothing
and keep nothing.  The open spans live in a ``ContextVar``: each thread and
each task has its own, and a task started inside a span does not close it.
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Optional

from . import recorder

#: the spans open in this context: a tuple of ``(name, cat, args, start_ns, phase)``, innermost last
_open: contextvars.ContextVar[tuple] = contextvars.ContextVar("rlinf_trace_spans", default=())


def _phase() -> str:
    try:
        in_task = asyncio.current_task() is not None
    except RuntimeError:  # no running loop in this thread
        in_task = False
    return "A" if in_task else "X"


def begin(name: str, cat: str = "default", args: Optional[dict] = None) -> None:
    """Open span ``name`` now (nothing while tracing is off here).

    Args:
        name: the span's name on the timeline.
        cat: its category.
        args: JSON-ready values shown with it (copied).
    Raises ``TypeError`` if ``name`` or ``cat`` is not a str, or ``args`` not a dict.
    """
    if not recorder.is_on():
        return
    if not isinstance(name, str) or not isinstance(cat, str):
        raise TypeError(f"a span's name and category are str, got {name!r} and {cat!r}")
    if args is not None and not isinstance(args, dict):
        raise TypeError(f"a span's args are a dict, got {type(args).__name__}")
    _open.set(_open.get() + ((name, cat, dict(args) if args else None, recorder.clock(), _phase()),))


def end(name: str, cat: str = "default") -> bool:
    """Close the innermost open span named ``name`` and record it; False if none is open here.

    Args:
        name: the name given to ``begin``.
        cat: ignored when the span was opened with a category (its own is kept); RLinf's signature.
    """
    stack = _open.get()
    for i in range(len(stack) - 1, -1, -1):
        if stack[i][0] == name:
            opened_name, opened_cat, args, start, phase = stack[i]
            _open.set(stack[:i] + stack[i + 1:])
            if recorder.is_on():
                recorder.record(phase, opened_name, opened_cat, start, recorder.clock(), args)
            return True
    return False
