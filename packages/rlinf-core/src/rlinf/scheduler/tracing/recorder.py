"""The in-process event buffer of the timeline.

Every process that traces (the driver and each worker) appends events to one
bounded ``deque``: an append is atomic under the GIL, so recording threads
take no lock, and when the buffer is full the oldest events give way (their
number is reported).  Times are ``perf_counter_ns`` (monotonic, cheap);
``dump`` turns them into this process's wall clock (``time_ns`` read once at
``enable``), and the collector then shifts each process onto the driver's
clock with the offset it measured.

Event tuples: ``(phase, name, category, start_ns, end_ns, thread_ident, args)``
with ``phase`` ``"X"`` (a span on its thread), ``"A"`` (an asynchronous span:
it may overlap others on its thread, shown on a track of its own) or ``"i"``
(an instant).
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
from typing import Optional

from .. import context

#: events one process keeps (the oldest give way beyond it)
MAX_EVENTS_ENV = "RLINF_TRACE_MAX_EVENTS"
DEFAULT_MAX_EVENTS = 500_000

clock = time.perf_counter_ns

_events: collections.deque = collections.deque(maxlen=DEFAULT_MAX_EVENTS)
_dropped = 0  # events that gave way to newer ones since the buffer was last drained
_thread_names: dict = {}
_delta_ns = time.time_ns() - clock()  # wall-clock ns minus perf_counter_ns, read again at enable
_on = False
_lock = threading.Lock()


def is_on() -> bool:
    return _on


def _max_events() -> int:
    raw = os.environ.get(MAX_EVENTS_ENV)
    if not raw:
        return DEFAULT_MAX_EVENTS
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable {MAX_EVENTS_ENV}={raw!r} is not a whole number of events") from None
    if value < 1:
        raise ValueError(f"environment variable {MAX_EVENTS_ENV}={raw!r} must be at least 1")
    return value


def enable() -> bool:
    """Start recording in this process (hook points wrapped); False if it already was."""
    global _on, _events, _delta_ns
    with _lock:
        if _on:
            return False
        size = _max_events()
        if _events.maxlen != size:
            _events = collections.deque(_events, maxlen=size)
        _delta_ns = time.time_ns() - clock()
        from . import hooks, wrappers

        hooks.install(wrappers.make)
        _on = True
        return True


def disable() -> None:
    """Stop recording (originals back in place); what was recorded stays until drained."""
    global _on
    with _lock:
        if not _on:
            return
        from . import hooks

        hooks.uninstall()
        _on = False


def wall_ns() -> int:
    """Now, on the clock the events of this process are dumped in."""
    return clock() + _delta_ns


def record(phase: str, name: str, cat: str, start: int, end: int, args: Optional[dict] = None) -> None:
    global _dropped
    tid = threading.get_ident()
    if tid not in _thread_names:
        _thread_names[tid] = threading.current_thread().name
    if len(_events) == _events.maxlen:
        _dropped += 1  # approximate under contention: it is a report, not an invariant
    _events.append((phase, name, cat, start, end, tid, args))


def _read_boot_id() -> str:
    """What names this machine's clock: processes with the same boot id read one kernel clock."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


_boot_id = None


def boot_id() -> str:
    global _boot_id
    if _boot_id is None:
        _boot_id = _read_boot_id()
    return _boot_id


#: names of the values of an event whose args were recorded as a tuple (cheaper than a dict)
ARG_NAMES = ("peer", "bytes", "transport", "error")


def _args(args):
    if type(args) is not tuple:
        return args
    out = {}
    for key, value in zip(ARG_NAMES, args):
        get_name = getattr(value, "get_name", None)  # a WorkerAddress
        out[key] = get_name() if get_name is not None else value
    return out


def identity() -> dict:
    """Who this process is: the worker it hosts, or the driver."""
    ctx = context.current()
    host = socket.gethostname()
    if ctx is None:
        return {"label": f"driver @ {host}", "group": None, "rank": None, "node": None, "pid": os.getpid(),
                "host": host, "boot": boot_id()}
    return {"label": f"{ctx.group_key}:{ctx.rank} @ node {ctx.info.node_id}", "group": ctx.group_key,
            "rank": ctx.rank, "node": ctx.info.node_id, "pid": os.getpid(), "host": host, "boot": boot_id()}


def dump(drain: bool) -> dict:
    """This process's events on its wall clock, with its identity; ``drain`` empties the buffer."""
    global _dropped
    delta = _delta_ns
    dropped = _dropped
    if drain:
        events = []
        pop = _events.popleft
        try:
            while True:
                events.append(pop())
        except IndexError:
            pass
    else:
        events = list(_events)
    if drain:
        _dropped = 0
    out = identity()
    out["events"] = [(ph, name, cat, start + delta, end + delta, tid, _args(args))
                     for ph, name, cat, start, end, tid, args in events]
    out["dropped"] = dropped
    out["threads"] = dict(_thread_names)
    return out


def reset() -> None:
    """Forget every event (tests; a released MPI rank starting a new worker)."""
    global _dropped
    _events.clear()
    _dropped = 0
    _thread_names.clear()
