"""Per-pair ordering: operations complete in the order they were issued.

Each direction of each pair has a ``Turnstile``: an operation takes a ticket
when it is called (so call order decides) and runs when its turn comes.
Asynchronous operations run on the pair's ``SerialRunner``, one daemon
thread, so a blocked operation never holds a process exit hostage and
queued operations never starve each other of threads.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from typing import Callable, Optional


class Turnstile:
    def __init__(self):
        self._lock = threading.Lock()  # taken directly on the fast path; the condition only for waiting
        self._cond = threading.Condition(self._lock)
        self._next = 0
        self._serving = 0
        self._abandoned: set[int] = set()
        self._waiting = 0

    def take(self) -> int:
        with self._lock:
            ticket = self._next
            self._next += 1
            return ticket

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
            self._serving += 1
            while self._serving in self._abandoned:
                self._abandoned.discard(self._serving)
                self._serving += 1
            if self._waiting:
                self._cond.notify_all()


class SerialRunner:
    """Runs submitted callables one at a time, in order, on a daemon thread.

    The thread exits after ``IDLE_EXIT`` seconds without work and is started
    again by the next ``submit``, so pairs that went quiet (or whose peer is
    gone) hold no thread.
    """

    IDLE_EXIT = 2.0

    def __init__(self, name: str):
        self._name = name
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()

    def submit(self, fn: Callable) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, fut))
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        return fut

    def _run(self) -> None:
        while True:
            try:
                fn, fut = self._queue.get(timeout=self.IDLE_EXIT)
            except queue.Empty:
                with self._lock:  # submit() starts a new thread unless we stay
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:
                fut.set_exception(exc)
