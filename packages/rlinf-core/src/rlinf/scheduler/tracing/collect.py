"""Switching tracing on in running workers and gathering their events.

The driver reaches every worker through the ordinary group-call machinery: a
control call ``Worker._rlinf_trace(op, ...)`` (``handle`` below runs it in the
worker).  Every gather is bounded (``RLINF_TRACE_TIMEOUT``, 10 s by default):
a worker that is busy in a long call, or dead, is named in the trace's notes
and its events are missing; nothing waits for it longer.

Clocks: processes on one machine (same boot id) read one monotonic clock,
which events are recorded on; each converts to its wall clock with the
difference it read when it started recording (``clock_delta_ns`` in its dump),
and the difference between that and the driver's own is the offset applied:
exact, even when the wall clock was stepped or slewed between the two starts.  For each worker on another machine the driver takes a few timed round trips and keeps the
one with the smallest round-trip time, NTP-style: the worker's clock minus the
midpoint of the driver's send and receive times is the worker's offset, off by
at most half that round trip.  Events are shifted by it before they are merged.

Groups stopped while tracing is on (``group.stop()``, ``cluster.shutdown()``)
hand over their events first, so a program that stops its groups before it
ends still has them in its trace.  A worker that stops its own child groups
keeps their events and passes them on with its own.
"""

from __future__ import annotations

import os
import time
from typing import Optional

from ..base import config
from . import recorder

COLLECT_TIMEOUT_ENV = "RLINF_TRACE_TIMEOUT"
DEFAULT_COLLECT_TIMEOUT = 10.0
#: set while tracing is on, so that groups launched meanwhile (by anyone) record from their start
RECORD_ENV = "RLINF_TRACE_RECORD"
CONTROL = "_rlinf_trace"
CLOCK_SAMPLES = 5

#: dumps of groups that stopped while tracing was on (already on this process's clock)
_kept: list = []
#: what could not be collected, said in the trace
_notes: list = []
#: seconds all workers owing an earlier answer get, together, to give it before a control call skips them
#: (one just freed runs its queued control calls within milliseconds)
EARLIER_GRACE = 0.5


class _Owed:
    """A control call a worker did not answer in time: it is busy (or hung) in a call of its own, and a
    later control call would only queue behind it and be waited for as long again."""

    __slots__ = ("op", "call", "handle", "keep", "trace")

    def __init__(self, op: str, call, handle, keep: bool):
        self.op, self.call, self.handle = op, call, handle
        self.keep = keep  # a draining collect: its late answer holds events nobody will ask for again
        self.trace = _trace


#: (group, rank) -> the control call that worker owes (later ones are sent behind it without a wait)
_unanswered: dict = {}
#: the trace now being recorded; a late answer to a collect of an earlier one is dropped (it was written)
_trace = 0


def collect_timeout() -> float:
    return config._float_env(COLLECT_TIMEOUT_ENV, DEFAULT_COLLECT_TIMEOUT)


# -- in the worker -----------------------------------------------------------------------------
def handle(op: str, drain: bool = False):
    """Run control operation ``op`` in this worker (called through ``Worker._rlinf_trace``)."""
    _give_back_orphan_timings()
    if op == "start":
        recorder.enable()
        os.environ[RECORD_ENV] = "1"  # groups this worker launches from now on record too
        return True
    if op == "clock":
        return recorder.wall_ns()
    if op == "collect":
        return own_dumps(drain)
    if op == "stop":
        os.environ.pop(RECORD_ENV, None)
        _forget()
        return True
    raise ValueError(f"unknown trace control operation {op!r}")


def _forget() -> None:
    """Recording off and everything recorded dropped: a later trace starts empty."""
    global _trace
    recorder.disable()
    recorder.reset()
    _kept.clear()
    _notes.clear()
    _trace += 1
    for key, owed in list(_unanswered.items()):  # answered since, or gone with its group
        if owed.call.done():
            _unanswered.pop(key, None)


def _give_back_orphan_timings() -> None:
    """A control call runs like a group call, so it was handed the timings recorded outside any call;
    they belong to the user's next call: put them back."""
    from ..base import timing

    log = timing._current_log.get()
    if log:
        with timing._orphans_lock:
            for tag, seconds in log.items():
                timing._orphans[tag] = timing._orphans.get(tag, 0.0) + seconds
            log.clear()


def own_dumps(drain: bool) -> dict:
    """This process's events and those it kept from groups it stopped, with its notes (each once)."""
    dumps = [recorder.dump(drain)] + list(_kept)
    notes = list(dict.fromkeys(_notes))
    if drain:
        _kept.clear()
        _notes.clear()
    return {"dumps": dumps, "notes": notes}


# -- in the driver (or any process that launched groups) -------------------------------------------
#: ``fn(session) -> {group name: (handles, worker records)}``: the groups this process launched, by the
#: runtime that launches them (``group_source``); the cluster's registry names the others
_group_sources: list = []


def group_source(fn):
    """Register ``fn(session)``: the groups of ``session`` this process launched and still runs."""
    _group_sources.append(fn)
    return fn


def _targets(session) -> dict:
    """``{group name: (handles, worker records)}`` of every group running in the session's cluster."""
    found = {}
    for source in list(_group_sources):
        found.update(source(session))
    try:
        names = session.list_groups()
    except Exception as exc:
        _notes.append(f"could not list the cluster's groups: {type(exc).__name__}: {exc}")
        names = []
    for name in names:
        if name in found:
            continue
        try:
            record = session.lookup_group(name)
            handles = session.attach_group(name) if record is not None else None
        except NotImplementedError:
            _notes.append(f"group {name!r}: the {session.launcher_name} launcher cannot reach a group launched "
                          f"elsewhere; its events are not in the trace")
            continue
        except Exception as exc:
            _notes.append(f"group {name!r}: {type(exc).__name__}: {exc}")
            continue
        if record is not None and handles:
            found[name] = (list(handles), list(record.workers))
    return found


def _describe(name: str, rank: int, records: list) -> str:
    try:
        info = records[rank].info
        return f"{name}:{rank} (node {info.node_id}, {info.node_ip}, pid {info.pid})"
    except (IndexError, AttributeError):
        return f"{name}:{rank}"


def _call_all(session, targets: dict, op: str, args: tuple, timeout: float) -> dict:
    """Run control ``op`` on every worker of ``targets`` at once; ``{(group, rank): value}`` of those that answered.

    Bounded by ``timeout`` in all; every worker that did not answer is noted.  A worker that has not
    answered an earlier control call yet is not waited for again: ``stop`` is sent to it (it runs
    after the earlier one), anything else is skipped with a note."""
    from ..plugins.launcher import CallOutcome, Died

    calls = []
    owing = _still_owing(session, targets, op, args)
    for name, (handles, records) in targets.items():
        for rank, handle in enumerate(handles):
            if (name, rank) in owing:
                continue
            try:
                calls.append((name, rank, records, session.submit(handle, CONTROL, args, {})))
            except Exception as exc:
                _notes.append(f"{_describe(name, rank, records)}: not reachable ({type(exc).__name__}: {exc}); "
                              f"its events are missing")
    deadline = time.monotonic() + timeout
    results = {}
    for name, rank, records, call in calls:
        who = _describe(name, rank, records)
        left = deadline - time.monotonic()
        try:
            if left <= 0 and not call.done():
                raise TimeoutError
            outcome = session.collect([call], max(left, 0.05))[0]
        except TimeoutError:
            _notes.append(f"{who}: no answer to trace {op} within {timeout:g} s (busy in a long call?); "
                          f"its events are missing")
            drains = op == "collect" and args[-1] is True  # ("collect", drain)
            _unanswered[(name, rank)] = _Owed(op, call, targets[name][0][rank], keep=drains)
            continue
        except Exception as exc:
            _notes.append(f"{who}: trace {op} failed: {type(exc).__name__}: {exc}")
            continue
        if isinstance(outcome, Died):
            _notes.append(f"{who}: the worker died ({outcome.reason}); its events are lost")
        elif type(outcome) is not CallOutcome:
            _notes.append(f"{who}: trace {op} could not run: {getattr(outcome, 'reason', outcome)}")
        elif not outcome.ok:
            _notes.append(f"{who}: trace {op} failed: {outcome.value}")
        else:
            results[(name, rank)] = outcome.value
    return results


def _same_handle(a, b) -> bool:
    try:
        return a is b or a == b
    except Exception:
        return False


def _still_owing(session, targets: dict, op: str, args: tuple) -> set:
    """The workers of ``targets`` that still owe an answer to an earlier control call: ``op`` is not
    waited for there.  ``start`` and ``stop`` are sent to them anyway (a worker runs them in order, when
    it gets to them); ``collect`` is skipped, with a note.  A draining ``collect`` of this trace answered
    since is not thrown away: it emptied the worker's buffer, so its events are kept.  Bounded: one
    shared grace of ``EARLIER_GRACE`` s for all of them, which also bounds keeping the late answers."""
    owing = []
    for key, owed in list(_unanswered.items()):
        found = targets.get(key[0])
        if found is None:
            continue  # its group is not asked now
        handles = found[0]
        if key[1] >= len(handles) or not _same_handle(handles[key[1]], owed.handle):
            del _unanswered[key]  # a group relaunched under the name: another worker
            continue
        owing.append((key, owed))
    if not owing:
        return set()
    grace_end = time.monotonic() + EARLIER_GRACE
    while time.monotonic() < grace_end and not all(owed.call.done() for _, owed in owing):
        time.sleep(0.01)
    busy = set()
    for key, owed in owing:
        name, rank = key
        handles, records = targets[name]
        if owed.call.done():
            del _unanswered[key]
            if owed.keep and owed.trace == _trace:
                _keep_late_answer(session, name, rank, handles, records, owed.call, grace_end)
            continue
        busy.add(key)
        if op in ("start", "stop"):
            try:
                session.submit(handles[rank], CONTROL, args, {})  # queued behind the one it owes
            except Exception:
                pass
        else:
            _notes.append(f"{_describe(name, rank, records)}: still busy (no answer to trace {owed.op} yet); "
                          f"its events are missing")
    return busy


def _keep_late_answer(session, name: str, rank: int, handles: list, records: list, call, deadline: float) -> None:
    try:
        outcome = session.collect([call], max(0.05, deadline - time.monotonic()))[0]
        if getattr(outcome, "ok", False):
            _kept.extend(_aligned(session, name, rank, handles, records, outcome.value, deadline))
    except Exception:  # it was noted missing already
        pass


def _offset(session, handle, deadline: float) -> Optional[int]:
    """The worker's clock minus ours, from the round trip with the smallest time (None: no answer)."""
    best = None
    for _ in range(CLOCK_SAMPLES):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        t0 = recorder.wall_ns()
        try:
            outcome = session.collect([session.submit(handle, CONTROL, ("clock",), {})], left)[0]
        except Exception:
            break
        t1 = recorder.wall_ns()
        if not getattr(outcome, "ok", False):
            break
        rtt = t1 - t0
        if best is None or rtt < best[0]:
            best = (rtt, outcome.value - (t0 + t1) // 2)
    return None if best is None else best[1]


def _shift(dump: dict, offset: int) -> dict:
    if offset:
        dump["events"] = [(ph, n, c, s - offset, e - offset, t, a) for ph, n, c, s, e, t, a in dump["events"]]
    dump["offset_ns"] = dump.get("offset_ns", 0) + offset
    return dump


def gather(session, targets: dict, drain: bool) -> list:
    """Every worker's dumps, on this process's clock (bounded: see ``collect_timeout``)."""
    timeout = collect_timeout()
    answers = _call_all(session, targets, "collect", ("collect", drain), timeout)
    deadline = time.monotonic() + timeout
    dumps = []
    for (name, rank), answer in answers.items():
        handles, records = targets[name]
        dumps.extend(_aligned(session, name, rank, handles, records, answer, deadline))
    return dumps


def _aligned(session, name: str, rank: int, handles: list, records: list, answer: dict, deadline: float) -> list:
    """A worker's answer to ``collect``: its dumps on this process's clock (its notes go to ours)."""
    own = answer["dumps"][0]
    if own.get("boot") == recorder.boot_id():  # one machine, one monotonic clock: exact, unlike a round trip
        offset = own.get("clock_delta_ns", recorder._delta_ns) - recorder._delta_ns
    else:
        offset = _offset(session, handles[rank], deadline)
    if offset is None:
        _notes.append(f"{_describe(name, rank, records)}: its clock could not be read; its events are not aligned")
        offset = 0
    _notes.extend(answer.get("notes", ()))
    return [_shift(d, offset) for d in answer["dumps"]]


def start_everywhere(session) -> None:
    """Switch recording on here and in every running worker of the session's cluster."""
    recorder.enable()
    os.environ[RECORD_ENV] = "1"
    _call_all(session, _targets(session), "start", ("start",), collect_timeout())


def stop_everywhere(session) -> None:
    os.environ.pop(RECORD_ENV, None)
    if session is not None:
        _call_all(session, _targets(session), "stop", ("stop",), collect_timeout())
    _forget()


def snapshot(session, drain: bool) -> tuple:
    """(dumps, notes): this process's events, every running worker's and those kept from stopped groups."""
    dumps = gather(session, _targets(session), drain) if session is not None else []
    mine = own_dumps(drain)
    return mine["dumps"] + dumps, mine["notes"]


def keep_group_before_stop(group) -> None:
    """``group.stop()`` while tracing: take the group's events first (bounded), they end with its processes."""
    try:
        _kept.extend(gather(group._session, {group._name: (list(group._handles), list(group._records))}, True))
    except Exception as exc:  # never let tracing stop a stop
        _notes.append(f"group {group._name!r}: its events could not be taken before it stopped: {exc}")


def keep_all_before_shutdown(cluster) -> None:
    """``cluster.shutdown()`` while tracing: take every group's events first (bounded)."""
    try:
        _kept.extend(gather(cluster.session, _targets(cluster.session), True))
    except Exception as exc:
        _notes.append(f"events could not be taken before the cluster shut down: {exc}")
