"""Per-call wall-time measurement inside workers.

A group call runs inside ``capture_durations()``, which gives the call its own
log; ``worker_timer(tag)`` adds to whichever log is current.  The log travels
back with that call's results (no extra round trip), so two calls never mix
their timings.  Timers that run outside any call (a background thread, a
constructor, an ``asyncio`` task still running after the call that created it
returned) are kept aside and delivered with the next call.

Independently, every timing also accumulates in a per-process store that
``Worker.pop_execution_time(tag)`` / ``pop_execution_times()`` drain, as in
RLinf, so a worker can report its own timings however it likes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import sys
import threading
import time
from typing import Callable, Iterator, Sequence

from .hooks import hook

class _CallLog(dict):
    """The timings of one call; ``closed`` once the call returned (later timings become orphans)."""

    __slots__ = ("closed",)

    def __init__(self, *args):
        super().__init__(*args)
        self.closed = False


_current_log: contextvars.ContextVar[_CallLog | None] = contextvars.ContextVar("rlinf_duration_log", default=None)
_orphans: dict[str, float] = {}
_orphans_lock = threading.Lock()
#: everything recorded in this process and not popped yet (``Worker.pop_execution_time``)
_unpopped: dict[str, float] = {}

REDUCTIONS = ("max", "min", "mean")


def record_duration(tag: str, seconds: float) -> None:
    log = _current_log.get()
    with _orphans_lock:
        _unpopped[tag] = _unpopped.get(tag, 0.0) + seconds
        if log is None or log.closed:
            _orphans[tag] = _orphans.get(tag, 0.0) + seconds
            return
    log[tag] = log.get(tag, 0.0) + seconds


def pop_execution_time(tag: str) -> float:
    """Seconds recorded under ``tag`` since it was last popped; ``ValueError`` if none were."""
    with _orphans_lock:
        if tag not in _unpopped:
            raise ValueError(f"Timer {tag!r} has not been recorded (recorded: {sorted(_unpopped)})")
        return _unpopped.pop(tag)


def pop_execution_times() -> dict[str, float]:
    """Every tag's seconds since the last pop, and forget them."""
    with _orphans_lock:
        out = dict(_unpopped)
        _unpopped.clear()
    return out


def _caller_name(depth: int) -> str:
    return sys._getframe(depth + 1).f_code.co_name


def worker_timer(tag: str | None = None, _depth: int = 1):
    """Time the body and record it under ``tag`` (repeated tags add up).

    Without a tag, the name of the function that opens the timer is used.
    """
    if tag is None:
        tag = _caller_name(_depth)
    if not isinstance(tag, str) or not tag:
        raise ValueError(f"a timer tag must be a non-empty str, got {tag!r}")
    return _timed(tag)


@hook("timer")
@contextlib.contextmanager
def _timed(tag: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        record_duration(tag, time.perf_counter() - start)


def timer(tag: str | None = None) -> Callable:
    """Decorator form of ``worker_timer``; works on plain and ``async`` functions.

    ``@timer()`` and bare ``@timer`` use the function's name as the tag.
    """
    if callable(tag):  # used bare: @Worker.timer
        return timer(None)(tag)
    if tag is not None and (not isinstance(tag, str) or not tag):
        raise ValueError(f"a timer tag must be a non-empty str, got {tag!r}")

    def wrap(fn):
        name = tag or fn.__name__
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_timed(*args, **kwargs):
                with _timed(name):
                    return await fn(*args, **kwargs)

            return async_timed

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            with _timed(name):
                return fn(*args, **kwargs)

        return timed

    return wrap


@contextlib.contextmanager
def capture_durations() -> Iterator[dict]:
    """Give the enclosed call a fresh log (seeded with orphaned timings) and yield it."""
    with _orphans_lock:
        log = _CallLog(_orphans)
        _orphans.clear()
    token = _current_log.set(log)
    try:
        yield log
    finally:
        with _orphans_lock:  # a task this call started may time on after it returned
            log.closed = True
        _current_log.reset(token)


def reduce_durations(per_rank: Sequence[dict], reduction_type: str = "max") -> dict[str, float]:
    """Reduce tag -> seconds dicts over ranks; a tag missing on a rank is skipped there."""
    if reduction_type not in REDUCTIONS:
        raise ValueError(f"reduction_type must be one of {REDUCTIONS}, got {reduction_type!r}")
    gathered: dict[str, list[float]] = {}
    for durations in per_rank:
        for tag, value in durations.items():
            gathered.setdefault(tag, []).append(value)
    if reduction_type == "max":
        return {t: max(v) for t, v in gathered.items()}
    if reduction_type == "min":
        return {t: min(v) for t, v in gathered.items()}
    return {t: sum(v) / len(v) for t, v in gathered.items()}
