"""Per-call wall-time measurement inside workers.

A group call runs inside ``capture_durations()``, which gives the call its own
log; ``worker_timer(tag)`` adds to whichever log is current.  The log travels
back with that call's results (no extra round trip), so two calls never mix
their timings.  Timers that run outside any call (a background thread, a
constructor) are kept aside and delivered with the next call.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import threading
import time
from typing import Callable, Iterator, Sequence

_current_log: contextvars.ContextVar[dict | None] = contextvars.ContextVar("rlinf_duration_log", default=None)
_orphans: dict[str, float] = {}
_orphans_lock = threading.Lock()

REDUCTIONS = ("max", "min", "mean")


def record_duration(tag: str, seconds: float) -> None:
    log = _current_log.get()
    if log is None:
        with _orphans_lock:
            _orphans[tag] = _orphans.get(tag, 0.0) + seconds
    else:
        log[tag] = log.get(tag, 0.0) + seconds


@contextlib.contextmanager
def worker_timer(tag: str) -> Iterator[None]:
    """Time the body and record it under ``tag`` (repeated tags add up)."""
    if not isinstance(tag, str) or not tag:
        raise ValueError(f"a timer tag must be a non-empty str, got {tag!r}")
    start = time.perf_counter()
    try:
        yield
    finally:
        record_duration(tag, time.perf_counter() - start)


def timer(tag: str) -> Callable:
    """Decorator form of ``worker_timer``; works on plain and ``async`` functions."""

    def wrap(fn):
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_timed(*args, **kwargs):
                with worker_timer(tag):
                    return await fn(*args, **kwargs)

            return async_timed

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            with worker_timer(tag):
                return fn(*args, **kwargs)

        return timed

    return wrap


@contextlib.contextmanager
def capture_durations() -> Iterator[dict]:
    """Give the enclosed call a fresh log (seeded with orphaned timings) and yield it."""
    with _orphans_lock:
        log = dict(_orphans)
        _orphans.clear()
    token = _current_log.set(log)
    try:
        yield log
    finally:
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
