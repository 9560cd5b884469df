"""Bounded waits on MPI requests without MPI's blocking calls.

A blocking ``MPI_Wait`` can neither time out nor notice a peer that is gone,
and MPICH busy-polls a core for as long as it waits.  Every wait here tests
the request, spins for at most ``RLINF_MPI_SPIN_US`` microseconds (latency:
MPI's own round trips take microseconds, a sleep takes a scheduler tick),
then sleeps in growing steps up to ``MAX_SLEEP`` (CPU), and raises
``TimeoutError`` at its deadline.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from rlinf.scheduler.base.config import getenv

SPIN_ENV = "RLINF_MPI_SPIN_US"
DEFAULT_SPIN_US = 2000.0
#: longest sleep between two tests of a request
MAX_SLEEP = 0.001
_FIRST_SLEEP = 0.00002

_spin_cache: dict = {}
_testall = None

# Threads inside MPI calls made from here, so that ``MPI_Finalize`` runs only once none of them can call
# MPI again: a test after it aborts the rank ("Attempting to use an MPI routine ... after finalizing").
# One list entry per thread inside; ``list.append``/``pop`` are atomic, so entering costs no lock (it is on
# every message's path).  A thread appends, then looks at ``_ending``; ``end_waits`` sets ``_ending``, then
# looks at the list: whichever comes second sees the other.
_inside: list = []
_ending: Optional[str] = None  # why no MPI call may start any more (set by ``end_waits``)
#: ``leave_mpi()`` ends what ``enter_mpi()`` began
leave_mpi = _inside.pop


def enter_mpi() -> None:
    """Count this thread as inside MPI until ``leave_mpi()``.

    Raises:
        ConnectionError: the rank is ending (``end_waits`` ran): no MPI call may start.
    """
    _inside.append(None)
    if _ending:
        _inside.pop()
        raise ConnectionError(_ending)


class _InMpi:
    """``with IN_MPI:`` around MPI calls: ``enter_mpi``/``leave_mpi`` as a context manager."""

    __slots__ = ()

    def __enter__(self) -> None:
        enter_mpi()

    def __exit__(self, *exc) -> None:
        leave_mpi()


IN_MPI = _InMpi()


def end_waits(timeout: float, who: str) -> bool:
    """Before ``MPI_Finalize``: every wait ends at its next test (``ConnectionError`` naming ``who``,
    the ending rank), no new MPI call starts here, and this returns once no thread is inside one (False
    if some still were after ``timeout`` s)."""
    global _ending
    _ending = f"{who} is ending (MPI_Finalize): no more MPI operations on it"
    end = time.monotonic() + timeout
    while _inside:
        if time.monotonic() >= end:
            return False
        time.sleep(0.0005)
    return True


def spin_seconds() -> float:
    raw = getenv(SPIN_ENV)
    value = _spin_cache.get(raw)
    if value is None:
        try:
            value = max(0.0, float(raw)) / 1e6 if raw else DEFAULT_SPIN_US / 1e6
        except ValueError:
            value = DEFAULT_SPIN_US / 1e6
        _spin_cache[raw] = value
    return value


def wait_for(test: Callable[[], object], deadline: Optional[float], what: str = "deadline passed",
             alive: Optional[Callable[[], bool]] = None):
    """Call ``test`` until it returns something truthy; return that.

    ``alive`` (checked about once a second) lets a wait end early with
    ``ConnectionError`` when the peer is known to be gone; so does the end
    of this rank (``end_waits``), at the next test.
    """
    with IN_MPI:
        return _wait_for(test, deadline, what, alive)


def _wait_for(test, deadline, what, alive):
    result = test()
    if result:
        return result
    now = time.monotonic()
    spin_end = now + spin_seconds()
    while now < spin_end:
        result = test()
        if result:
            return result
        now = time.monotonic()
    sleep = _FIRST_SLEEP
    next_check = now + 1.0
    while True:
        if deadline is not None and now >= deadline:
            raise TimeoutError(what)
        if alive is not None and now >= next_check:
            if not alive():
                raise ConnectionError("the peer's process is gone")
            next_check = now + 1.0
        time.sleep(sleep if deadline is None else max(0.0, min(sleep, deadline - now)))
        sleep = min(sleep * 2, MAX_SLEEP)
        if _ending:
            raise ConnectionError(_ending)
        result = test()
        if result:
            return result
        now = time.monotonic()


def wait_requests(requests: list, deadline: Optional[float], what: str = "deadline passed",
                  alive: Optional[Callable[[], bool]] = None) -> None:
    """Wait until every MPI request completed."""
    if not requests:
        return
    global _testall
    if _testall is None:
        from mpi4py import MPI

        _testall = MPI.Request.Testall
    testall = _testall
    with IN_MPI:
        if not testall(requests):
            _wait_for(lambda: testall(requests), deadline, what, alive)
