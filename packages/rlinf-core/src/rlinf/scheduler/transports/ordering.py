"""Per-pair ordering: operations complete in the order they were issued.

Each direction of each pair has a ``Turnstile``: an operation takes a ticket
when it is called (so call order decides) and runs when its turn comes.
Asynchronous operations run on the pair's ``SerialRunner``, which queues
them and drains the queue on a small process-wide pool of daemon threads
(``_Pool``): a blocked operation never holds a process exit hostage, queued
operations never starve each other of threads, and the number of threads
does not grow with the number of peers.
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import sys
import threading
import time
from typing import Callable, Optional


#: ``next()`` on an ``itertools.count`` is one C call, atomic while the GIL serialises threads
_ATOMIC_COUNT = getattr(sys, "_is_gil_enabled", lambda: True)()


class Turnstile:
    """Runs the operations of one direction of one pair one at a time, in the order they took tickets.

    ``take`` hands out a ticket (call order decides the order), ``wait_turn``
    blocks until the ticket's turn, ``done`` finishes or abandons it.  When
    nothing is running or queued, an operation costs one lock (in ``done``):
    a ticket is drawn without a lock (one atomic ``next()``) and its turn is
    seen without one.
    """

    def __init__(self):
        self._lock = threading.Lock()  # taken directly on the fast path; the condition only for waiting
        self._cond = threading.Condition(self._lock)
        self._tickets = itertools.count()
        self._serving = 0
        self._abandoned: set[int] = set()
        self._waiting = 0

    if _ATOMIC_COUNT:
        def take(self) -> int:
            """The next ticket: tickets are handed out in call order, across threads."""
            return next(self._tickets)
    else:  # without the GIL, a lock makes the count's step atomic
        def take(self) -> int:
            """The next ticket: tickets are handed out in call order, across threads."""
            with self._lock:
                return next(self._tickets)

    def try_take(self) -> Optional[int]:
        """A ticket whose turn is now, or None when an operation is running or queued (never waits)."""
        ticket = self.take()
        if self._serving == ticket:  # every earlier ticket is done: only our done() moves it on now
            return ticket
        self.done(ticket)  # abandoned (or, if the earlier ones finished meanwhile, passed on at once)
        return None

    def wait_turn(self, ticket: int, deadline: Optional[float]) -> None:
        if self._serving == ticket:  # our turn already: no lock needed to know it
            return
        with self._cond:
            self._waiting += 1
            try:
                while self._serving != ticket:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError("earlier operations on this pair did not finish in time")
                    self._cond.wait(left)
            finally:
                self._waiting -= 1

    def done(self, ticket: int) -> None:
        """Finish (or abandon, if its turn never came) a ticket."""
        with self._lock:
            if self._serving != ticket:
                self._abandoned.add(ticket)
                return
            serving = ticket + 1
            abandoned = self._abandoned
            while abandoned and serving in abandoned:
                abandoned.discard(serving)
                serving += 1
            self._serving = serving
            if self._waiting:
                self._cond.notify_all()


class _Pool:
    """Threads shared by every pair's ``SerialRunner``: the thread count follows the work, not the peers.

    A queued job runs on an idle pool thread; a new thread starts only while
    fewer than ``SOFT_LIMIT`` exist, or when the queue made no progress for
    ``STALL`` seconds (every thread is blocked, say in receives whose peers
    wait for an operation still queued here: starting more threads, 1, 2, 4,
    ... per STALL while it lasts, is what keeps that from becoming a deadlock).  So an all-to-all round of quick
    sends runs on a handful of threads however many peers there are, and
    operations that block never starve the others.  A thread idle for
    ``IDLE_EXIT`` seconds exits.
    """

    SOFT_LIMIT = 4
    STALL = 0.05
    IDLE_EXIT = 2.0

    def __init__(self):
        lock = threading.Lock()
        self._cond = threading.Condition(lock)  # idle workers wait here: a notify always reaches a worker
        self._watch_cond = threading.Condition(lock)  # the watcher's own: it must never take a worker's wake-up
        self._jobs: "collections.deque" = collections.deque()
        self._threads = 0
        self._idle = 0
        self._progress = 0  # jobs started so far: the watcher compares it across a STALL
        self._watching = False

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append(job)
            if self._idle > len(self._jobs) - 1:
                self._cond.notify()
                return
            if self._threads < self.SOFT_LIMIT:
                self._start()
            elif not self._watching:
                self._watching = True
                threading.Thread(target=self._watch, name="rlinf-p2p-watch", daemon=True).start()

    def _start(self) -> None:  # lock held
        self._threads += 1
        try:
            threading.Thread(target=self._work, name="rlinf-p2p", daemon=True).start()
        except RuntimeError:  # no thread to be had now: the queued jobs run on the threads there are
            self._threads -= 1
            if self._threads == 0:
                raise

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._idle += 1
                    try:
                        # bounded: a thread waits at most IDLE_EXIT per round, then leaves if nothing came
                        timed_out = not self._cond.wait(self.IDLE_EXIT)
                    finally:
                        self._idle -= 1
                    if timed_out and not self._jobs:
                        self._threads -= 1
                        return
                job = self._jobs.popleft()
                self._progress += 1
            job()  # a job never raises: SerialRunner._drain catches everything

    def _watch(self) -> None:
        """While jobs are queued: start a thread whenever a STALL passes without one being taken."""
        with self._cond:
            seen = self._progress
            burst = 1  # doubles while the stall lasts: many blocked jobs get their threads in a few rounds
            while self._jobs:
                self._watch_cond.wait(self.STALL)  # bounded: wakes every STALL while jobs are queued
                if self._jobs and self._progress == seen and self._idle == 0:
                    for _ in range(min(burst, len(self._jobs))):
                        self._start()
                    burst *= 2
                else:
                    burst = 1
                seen = self._progress
            self._watching = False


_pool = _Pool()


class SerialRunner:
    """Runs submitted callables one at a time, in order, on the process's shared threads.

    The pair's queue is drained by one pool thread at a time, so order within
    the pair holds; pairs with nothing queued hold no thread at all.
    """

    def __init__(self, name: str):
        self._name = name
        self._queue: "collections.deque" = collections.deque()
        self._lock = threading.Lock()
        self._draining = False

    def submit(self, fn: Callable) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            self._queue.append((fn, fut))
            if self._draining:
                return fut
            self._draining = True
        try:
            _pool.submit(self._drain)
        except BaseException:
            with self._lock:
                self._draining = False
                self._queue.remove((fn, fut))
            raise
        return fut

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                fn, fut = self._queue.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)
