"""The in-process event buffer of the timeline.

Every process that traces (the driver and each worker) appends events to one
``deque``: an ``append`` is atomic under the GIL, so recording threads take no
lock, and the point-to-point ones test nothing either: a test of the
buffer's length at each event cost a small p2p round trip about 1.5%
(measured in place).  A trimmer thread (``_Trimmer``, every ``TRIM_INTERVAL``
s while recording is on, and every dump) keeps the buffer to
``RLINF_TRACE_MAX_EVENTS``: the oldest events give way and their number is
reported.  ``record`` (every other event: calls, timers, channel operations,
much rarer than messages) trims the buffer itself once it is ``_slack(limit)``
past the limit; the deque's own ``maxlen`` is twice that slack past it, so
memory stays bounded even if the trimmer is starved, and should it fill up
anyway (events it drops itself go uncounted) the dump says the count is a
lower bound (``overflowed``).  Times are ``perf_counter_ns`` (monotonic, cheap);
``dump`` turns them into this process's wall clock (``time_ns`` read once at
``enable``), and the collector then shifts each process onto the driver's
clock with the offset it measured.

An event is one tuple ``(what, start_ns, end_ns, thread, a0, a1, a2)``:
``what`` is a shared ``(phase, name, category)`` tuple, ``thread`` the
number of the recording thread, one int object per thread (``_local``),
and ``a0`` is a dict of arguments (or None), or ``a0..a2`` are the peer,
bytes and transport of a p2p event (the transport paired with the error as a
tuple when it failed; ``ARG_NAMES``).  One ``append`` of one tuple is the
cheapest record CPython offers: writing the same values as seven slots of
the buffer cost a small p2p round trip about 2% more (measured in place).
A tuple is an object the garbage collector tracks, but one that holds only
strings, numbers and untracked tuples (a p2p event that succeeded, a
``what``) is untracked by the first young collection that sees it, so a long
buffer does not slow later collections; a failed p2p event is untracked by
a later one, and only events carrying a dict of arguments (group calls,
channel operations, a few per call) stay tracked.
``phase`` is ``"X"`` (a span on its thread), ``"A"`` (an asynchronous span:
it may overlap others on its thread, shown on a track of its own) or ``"i"``
(an instant).  ``dump`` returns ``(phase, name, category, start, end, thread,
args)`` tuples.
"""

from __future__ import annotations

import collections
import itertools
import os
import socket
import threading
import time
import weakref
from typing import Optional

from ..base import context

#: ``factory(kind, fn) -> wrapper`` that records one kind of hook point: registered by ``wrappers``, which
#: records into this buffer (``provide_wrappers``)
_wrapper_factory = None


def provide_wrappers(factory) -> None:
    """Register the factory that ``enable`` installs at every hook point."""
    global _wrapper_factory
    _wrapper_factory = factory

#: events one process keeps (the oldest give way beyond it)
MAX_EVENTS_ENV = "RLINF_TRACE_MAX_EVENTS"
DEFAULT_MAX_EVENTS = 500_000

clock = time.perf_counter_ns

#: seconds between two trims of the buffer to its limit
TRIM_INTERVAL = 0.25


def _slack(capacity: int) -> int:
    """Events past the limit that ``record`` lets be before trimming itself: a trim interval of messages
    (each takes microseconds: a few hundred thousand a second at most, over all threads of a process)."""
    return max(capacity // 8, 1 << 16)


def _hard_limit(capacity: int) -> int:
    """The deque's ``maxlen``: its memory bound, should the trimmer not run."""
    return capacity + 2 * _slack(capacity)


_capacity = DEFAULT_MAX_EVENTS  # the limit the trimmer keeps the buffer to
_soft_high = DEFAULT_MAX_EVENTS + _slack(DEFAULT_MAX_EVENTS)  # past this, ``record`` trims itself
_events: collections.deque = collections.deque(maxlen=_hard_limit(_capacity))
#: buffers replaced by a new size (``enable``): a p2p wrapper made before, for an operation in flight
#: across the switch, still appends to its buffer, so they are drained with this one
_retired: collections.deque = collections.deque(maxlen=8)
_dropped = 0  # events that gave way to newer ones since the buffer was last drained
_overflowed = False  # the deque dropped events itself since then (uncounted): _dropped is a lower bound
_thread_numbers = itertools.count(1)  # unique per thread for the process's life: system thread ids are reused
_thread_names: dict = {}  # thread number -> (name, weak reference to the thread), for its track
_whats: dict = {}  # (phase, name, category) -> the one tuple events of that kind hold
_MAX_WHATS = 4096  # distinct kinds shared; beyond that (names made per call) each event holds its own
_delta_ns = time.time_ns() - clock()  # wall-clock ns minus perf_counter_ns, read again at enable
_on = False
_lock = threading.Lock()


class _ThreadNumber(threading.local):
    """``_local.thread``: the calling thread's number, the one int object its events hold.

    Taken the first time a thread reads it (``threading.local`` runs ``__init__`` once per thread;
    for the importing thread, at import), so recording code reads it with no test; a ``__getattr__``
    instead would cost every read about 35 ns.  The thread's name is read when events are dumped
    (``_thread_name``).  A number, not the system's thread id: an id is handed to the next thread
    once one ends, and the trace would put both threads' events on one track under one name."""

    def __init__(self):
        number = next(_thread_numbers)
        thread = threading.current_thread()
        _thread_names[number] = (thread.name, weakref.ref(thread))
        self.thread = number


_local = _ThreadNumber()


def _after_fork_in_child() -> None:
    """A child forked while another thread held the lock (a drain, say) gets a free one; threads are not
    forked, so a child that records gets a trimmer of its own."""
    global _lock
    _lock = threading.Lock()
    _Trimmer._stop = None
    if _on:
        _Trimmer.start()


os.register_at_fork(after_in_child=_after_fork_in_child)


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
    global _on, _events, _delta_ns, _capacity, _soft_high
    with _lock:
        if _on:
            return False
        size = _max_events()
        if _capacity != size:  # only here, while off: the wrappers installed below hold the buffer
            old, _events = _events, collections.deque(maxlen=_hard_limit(size))
            _pop_oldest(old, len(old) - size)  # what the new limit has no room for gives way, counted
            for _ in range(len(old)):  # moved one by one: what a late wrapper appends stays in ``old``
                _events.append(old.popleft())
            _retired.append(old)
            _capacity, _soft_high = size, size + _slack(size)
        _delta_ns = time.time_ns() - clock()
        from ..base import hooks

        if _wrapper_factory is None:
            raise RuntimeError("the recording wrappers are not loaded: import rlinf.scheduler.tracing.wrappers")
        hooks.install(_wrapper_factory)
        _on = True
        _Trimmer.start()
        return True


def disable() -> None:
    """Stop recording (originals back in place); what was recorded stays until drained."""
    global _on
    with _lock:
        if not _on:
            return
        from ..base import hooks

        hooks.uninstall()
        _on = False
        _Trimmer.stop()
    _trim()  # what was recorded until now, within the limit


def wall_ns() -> int:
    """Now, on the clock the events of this process are dumped in."""
    return clock() + _delta_ns


def what(phase: str, name: str, cat: str) -> tuple:
    """The shared ``(phase, name, category)`` of events of this kind."""
    key = (phase, name, cat)
    shared = _whats.get(key)
    if shared is None:
        if len(_whats) >= _MAX_WHATS:
            return key
        shared = _whats.setdefault(key, key)
    return shared


def record(phase: str, name: str, cat: str, start: int, end: int, a0=None, a1=None, a2=None, error=None) -> None:
    """One event; ``a0`` a dict of arguments, or ``a0..a2`` the peer, bytes and transport of a p2p
    event and ``error`` what it raised.

    The point-to-point wrappers do the same written out, without the length test (see
    ``wrappers._p2p_send``): the buffer and ``_local.thread`` are their contract too."""
    events = _events
    events.append((what(phase, name, cat), start, end, _local.thread, a0, a1, a2 if error is None else (a2, error)))
    if len(events) > _soft_high:
        _trim()


def _thread_name(number: int) -> str:
    """The name of thread ``number`` now, or the last one seen if it ended."""
    entry = _thread_names.get(number)
    if entry is None:
        return f"thread {number}"
    name, ref = entry
    thread = ref()
    if thread is not None and thread.name != name:
        name = thread.name
        _thread_names[number] = (name, ref)
    return name


def _forget_ended_threads(keep: set) -> None:
    """Drop the names of threads that ended and have no event left in the buffer (``keep``)."""
    for number, (_, ref) in list(_thread_names.items()):
        if ref() is None and number not in keep:
            _thread_names.pop(number, None)


def _pop_oldest(buffer: collections.deque, n: int) -> None:
    """Drop the ``n`` oldest events of ``buffer``, each counted as it goes (a fork midway leaves a
    child whose count matches its buffer)."""
    global _dropped
    popleft = buffer.popleft
    for _ in range(max(0, n)):
        popleft()
        _dropped += 1


def _trim() -> None:
    """Keep the buffer to its limit: the oldest events give way, counted (``_dropped``)."""
    global _overflowed
    with _lock:
        events = _events
        if len(events) >= events.maxlen:  # it dropped events itself, before anyone could count them
            _overflowed = True
        _pop_oldest(events, len(events) - _capacity)


class _Trimmer:
    """The thread that trims the buffer every ``TRIM_INTERVAL`` s while recording is on."""

    _stop: Optional[threading.Event] = None

    @classmethod
    def start(cls) -> None:
        if cls._stop is not None:
            return
        stop = cls._stop = threading.Event()

        def run():
            while not stop.wait(TRIM_INTERVAL):
                _trim()

        threading.Thread(target=run, name="rlinf-trace-trim", daemon=True).start()

    @classmethod
    def stop(cls) -> None:
        """Ends at its next wake-up; a new one may start meanwhile (each has its own event)."""
        if cls._stop is not None:
            cls._stop.set()
            cls._stop = None


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


#: names of the values of an event whose args were recorded as values (cheaper than a dict)
ARG_NAMES = ("peer", "bytes", "transport", "error")


def _args(a0, a1, a2):
    if a1 is None and a2 is None and (a0 is None or type(a0) is dict):
        return a0
    if type(a2) is tuple:  # (transport, error) of a p2p operation that failed
        return {"peer": a0, "bytes": a1, "transport": a2[0], "error": a2[1]}
    return {"peer": a0, "bytes": a1, "transport": a2}


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
    global _dropped, _overflowed
    delta = _delta_ns
    _trim()
    if drain:
        # popped, not replaced: the recording wrappers hold the buffer.  Its length only shrinks by
        # these pops (a trim waits for the lock), so every pop finds one, and an event appended
        # meanwhile is in this dump or stays for the next
        with _lock:
            dropped, _dropped = _dropped, 0
            overflowed, _overflowed = _overflowed, False
            events = []
            for buffer in (*_retired, _events):
                popleft = buffer.popleft
                events += [popleft() for _ in range(len(buffer))]
    else:
        dropped, overflowed = _dropped, _overflowed
        events = [e for buffer in (*_retired, _events) for e in list(buffer)]
    out = identity()
    out["events"] = [(*what, start + delta, end + delta, thread, _args(a0, a1, a2))
                     for what, start, end, thread, a0, a1, a2 in events]
    out["dropped"] = dropped
    out["overflowed"] = overflowed  # more gave way than counted: ``dropped`` is a lower bound
    out["clock_delta_ns"] = delta  # wall minus monotonic here: how a same-machine reader undoes the wall clock
    out["threads"] = {t: _thread_name(t) for t in {e[3] for e in events}}
    if drain:
        _forget_ended_threads({e[3] for buffer in (*_retired, _events) for e in list(buffer)})
    return out


def reset() -> None:
    """Forget every event (tests; a released MPI rank starting a new worker)."""
    global _dropped, _overflowed
    with _lock:
        _events.clear()
        _retired.clear()
        _dropped, _overflowed = 0, False
