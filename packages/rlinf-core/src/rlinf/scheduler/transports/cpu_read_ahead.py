"""Read-ahead for the CPU transport's network links: one reader thread per process, a budget per link.

On TCP a large message cannot go through shared memory, so two workers that
both send one before receiving would wait on each other forever.  Such links
read incoming messages ahead of their user, on the process's one reader
thread (``_Reader``), up to a budget; ``SocketLink`` takes its read-ahead
methods from ``_ReadAhead``.
"""

from __future__ import annotations

import selectors
import threading
import time
from typing import Optional

from ..plugins.transport import READ_AHEAD_MESSAGE_COST, LinkClosed
from .cpu_wire import _remaining


class _ReadAhead:
    """``SocketLink``'s read-ahead: its state lives in ``SocketLink.__init__``, its reads in ``_Receiving``."""

    def start_read_ahead(self, budget: int = 64 << 20) -> None:
        """Read incoming messages ahead of the user, up to ``budget`` bytes, on the process's reader thread.

        Used on TCP links, where a large message cannot go through shared
        memory: without it, two workers that both send a large message before
        receiving would wait on each other forever.  One ``_Reader`` thread
        serves every such link of the process, so threads do not grow with
        peers.
        """
        self._spin = 0.0
        self._reads_bounded = False  # the reader takes what is there; receives wait in _pop_ahead
        self._ahead_bytes = 0
        self._ahead_budget = budget
        self._ahead_paused = False
        self._ahead_cond = threading.Condition()
        _reader().add(self)

    def _pump_ahead(self) -> bool:
        """Called by the reader thread when the socket is readable: take every message that is
        complete, without waiting.  Returns False once the link needs no more reading (ended,
        failed, or over its budget: ``_pop_ahead`` resumes it)."""
        while True:
            with self._ahead_cond:
                if self._ahead_bytes >= self._ahead_budget:
                    self._ahead_paused = True  # with the lock held: _pop_ahead adds it back only after this
                    _reader().remove(self)
                    return True
            try:
                with self._rlock:
                    # a deadline already passed: stops at the first wait, keeping a partial message for next time
                    raw, frames = self._next(time.monotonic())
            except TimeoutError:
                return True
            except BaseException as exc:
                with self._ahead_cond:
                    self._ahead_error = exc
                    self._ahead_cond.notify_all()
                return False
            size = sum(len(f) for f in frames) + READ_AHEAD_MESSAGE_COST  # empty messages count too: the budget bounds memory
            with self._ahead_cond:
                self._ahead.append((raw, frames, size))
                self._ahead_bytes += size
                self._ahead_cond.notify_all()

    def _pop_ahead(self, deadline: Optional[float]) -> tuple[bool, list]:
        with self._ahead_cond:
            while not self._ahead:
                if self._ahead_error is not None:  # only once everything read before it was taken
                    err = self._ahead_error
                    raise err if isinstance(err, ConnectionError) else LinkClosed(str(err))
                left = _remaining(deadline)
                self._ahead_cond.wait(1.0 if left is None else min(left, 1.0))
            raw, frames, size = self._ahead.popleft()
            self._ahead_bytes -= size
            resume = self._ahead_paused and self._ahead_bytes < self._ahead_budget
            if resume:
                self._ahead_paused = False
        if resume:
            _reader().add(self)
        return raw, frames


class _Reader:
    """The process's one read-ahead thread: a selector over every TCP link that reads ahead.

    Registration and removal happen on the callers' threads under a lock
    (epoll allows that while the thread waits); the thread only waits and
    reads.  A link over its budget is removed until its user takes enough.
    """

    def __init__(self):
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def add(self, link: _ReadAhead) -> None:
        with self._lock:
            if link._rbroken is not None or link.sock.fileno() < 0:  # closing: close() sets _rbroken, then removes
                return
            try:
                self._selector.register(link.sock, selectors.EVENT_READ, link)
            except KeyError:
                pass  # already registered
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rlinf-cpu-reader", daemon=True)
                self._thread.start()

    def remove(self, link: _ReadAhead) -> None:
        with self._lock:
            try:
                self._selector.unregister(link.sock)
            except (KeyError, ValueError):
                pass

    def _run(self) -> None:
        while True:
            try:
                # bounded; a link registered meanwhile wakes the wait itself once it is readable (epoll)
                events = self._selector.select(timeout=1.0)
            except (OSError, ValueError):
                continue
            for key, _ in events:
                link = key.data
                if not link._pump_ahead():
                    self.remove(link)


_the_reader: Optional[_Reader] = None
_reader_lock = threading.Lock()


def _reader() -> _Reader:
    global _the_reader
    if _the_reader is None:
        with _reader_lock:
            if _the_reader is None:
                _the_reader = _Reader()
    return _the_reader
