"""While the driver waits on a group call: say which calls seem stuck and which workers died.

``WorkerGroupFuncResult.wait`` (and ``await``) marks the call it waits on
(``watching``); the launcher's collect loop, which wakes every second or so
anyway, calls ``tick`` with the outcomes it has so far.  A rank whose call has
run ``RLINF_STUCK_CALL_WARN`` seconds (default 300; 0 turns it off) without
returning, and a rank whose process died, are reported once per call as a
warning on the ``rlinf.watch`` logger, naming group, rank, node, pid and
method.  No thread of its own: nothing happens while nobody waits.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import time
from typing import Optional

from ..base import config
from .launcher import Died

STUCK_ENV = "RLINF_STUCK_CALL_WARN"
DEFAULT_STUCK = 300.0

_log = logging.getLogger("rlinf.watch")
_current: contextvars.ContextVar = contextvars.ContextVar("rlinf_watched_call", default=None)


def stuck_after() -> float:
    """Seconds after which a call still running is reported (0: never)."""
    return max(0.0, config._finite_env(STUCK_ENV, DEFAULT_STUCK))


class _Watch:
    __slots__ = ("result", "threshold", "stuck", "dead", "seen")

    def __init__(self, result):
        self.result = result
        self.threshold = None  # read at the first tick: most waits end before one
        self.stuck: set = set()
        self.dead: set = set()
        self.seen = 0  # outcomes already looked at (``finished`` only grows, in insertion order)

    def check(self, finished: dict) -> None:
        r = self.result
        for i, outcome in itertools.islice(finished.items(), self.seen, None):
            if type(outcome) is Died and i not in self.dead:
                self.dead.add(i)
                earlier = r._group._death(r._ranks[i], r._method, outcome.reason, r._submitted)
                if earlier:
                    _log.warning("worker %s was already dead when %r was called: %s", _where(r, r._ranks[i]),
                                 r._method, earlier)
                else:
                    _log.warning("worker %s died while running %r: %s", _where(r, r._ranks[i]), r._method,
                                 outcome.reason)
        self.seen = len(finished)
        if self.threshold is None:
            self.threshold = stuck_after()
        if not self.threshold:
            return
        running = time.monotonic() - r._submitted
        if running < self.threshold:
            return
        for i, rank in enumerate(r._ranks):
            if i not in finished and i not in self.stuck:
                self.stuck.add(i)
                _log.warning("call %r on worker %s has not returned after %.0f s (reported once; %s=%g)",
                             r._method, _where(r, rank), running, STUCK_ENV, self.threshold)


def _where(result, rank: int) -> str:
    group = result._group
    try:
        info = group._records[rank].info
        return f"{group._name}/{rank} (node {info.node_id} {info.node_ip}, pid {info.pid})"
    except (IndexError, AttributeError):
        return f"{group._name}/{rank}"


def watching(result) -> contextvars.Token:
    """Mark ``result`` as the call this thread (or task) waits on; pass the token to ``done``."""
    return _current.set(_Watch(result))


def done(token: contextvars.Token) -> None:
    _current.reset(token)


def tick(finished: Optional[dict] = None) -> None:
    """From a launcher's collect loop: ``finished`` maps the index of each call done so far to its outcome."""
    w = _current.get()
    if w is not None:
        w.check(finished or {})
