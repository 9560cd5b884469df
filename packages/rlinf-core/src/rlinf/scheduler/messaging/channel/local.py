"""``Channel.create(name, local=True)``: a channel that lives inside one process.

RLinf's local channel: the same operations and rules as a hosted channel
(keys, weights, ``get_batch``, ``maxsize`` flow control, ``*_nowait``,
``async_op``, timeouts) on an in-process queue, for threads and coroutines
of one process.  Items are handed over as they are (no copy, no encoding).
It cannot be passed to another process: pickling it raises ``TypeError``.

As on a hosted channel, a put whose caller got an error did not happen: a
blocking put that waited for room and is then interrupted (or times out) is
withdrawn, even if room was made for it just before.  Its item holds that
place unseen until its caller is about to return (as a hosted channel's
item waits for its producer's commit).  A get given up takes nothing: a
blocking get that raised (interrupted, timed out) is withdrawn, or puts what
it was served back at the head of its queue, and an asynchronous get's items
leave the channel only when the user takes them from its work.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from dataclasses import dataclass, field
from typing import Any, Optional

from ...base import config
from ...base.errors import CommTimeoutError
from ...transports.async_work import AsyncWork
from .keys import key_token, show_key
from .server import ChannelServer
from .take_work import TakeWork


class _PutWork(AsyncWork):
    """The AsyncWork of an asynchronous put: a ``wait(timeout)`` that runs out withdraws the put (unless
    it was queued just before), which then fails with ``CommTimeoutError``."""

    def __init__(self, fut: concurrent.futures.Future, what: str, expire):
        super().__init__(fut, what)
        self._expire = expire

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Wait for the put; raises ``CommTimeoutError`` once withdrawn, or the put's own error."""
        try:
            return super().wait(timeout)
        except TimeoutError:
            if self._future.done():
                raise  # its own error
        self._expire(timeout, True)
        return self._future.result(1.0)  # the withdrawal's error (set just after by whichever expire removed it), or None


def _first_item(records: list) -> Any:
    return records[0][0]


def _items(records: list) -> list:
    return [item for item, _ in records]


@dataclass
class _Queue:
    items: collections.deque = field(default_factory=collections.deque)  # (item, weight)
    getters: collections.deque = field(default_factory=collections.deque)  # (future, target or None)
    putters: collections.deque = field(default_factory=collections.deque)  # (future, item, weight, blocking)
    held: int = 0  # places given to blocking puts whose callers have not returned yet (their items unseen)


class LocalChannel:
    """An in-process channel; see the module docstring."""

    def __init__(self, name: str, maxsize: int):
        self._name = name
        self._maxsize = maxsize
        self._queues: dict[str, _Queue] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"Channel({self._name!r}, local=True)"

    def __reduce__(self):
        raise TypeError(f"channel {self._name!r} is local to the process that created it (local=True) and cannot be "
                        f"passed to another process; create it without local=True to share it")

    # -- plumbing ---------------------------------------------------------------
    def _finish(self, fut: concurrent.futures.Future, waiters: collections.deque, entry, async_op: bool,
                timeout: Optional[float], what: str, put: bool = False):
        """Return the result (sync) or an AsyncWork; a wait that times out withdraws its request first
        (with ``put``, so does a ``wait(t)`` of the AsyncWork that runs out)."""
        def expire(after: float, withdrawn: bool = False) -> None:
            with self._lock:
                try:
                    waiters.remove(entry)
                except ValueError:
                    return  # already served
            said = f"not finished after {after:g} s; it was withdrawn (it will not be delivered)" if withdrawn else \
                f"timed out waiting after {after:g} s"
            fut.set_exception(CommTimeoutError(f"{what}: {said}", peer=self._name))

        if async_op:
            if timeout is not None and not fut.done():
                timer = threading.Timer(timeout, expire, (timeout,))
                timer.daemon = True
                timer.start()
                fut.add_done_callback(lambda _f: timer.cancel())
            return _PutWork(fut, what, expire) if put else AsyncWork(fut, what)
        try:
            return fut.result(timeout)  # bounded: sync operations always carry a timeout
        except concurrent.futures.TimeoutError:
            expire(timeout)
            return fut.result(0)  # the timeout's exception, or the item served just before it

    def _progress(self, token: str) -> None:
        """Serve what the state of a key allows (lock held)."""
        q = self._queues.get(token)
        if q is None:
            return
        progressed = True
        while progressed:
            progressed = False
            while q.putters and self._has_room(q):
                fut, item, weight, blocking = q.putters.popleft()
                if blocking:
                    q.held += 1  # seen once its caller returns (_commit), dropped if it raises (_withdraw)
                else:
                    q.items.append((item, weight))
                    progressed = True
                fut.set_result(None)
            for entry in list(q.getters):
                if not q.items:
                    break
                fut, target = entry
                if target is None:
                    q.getters.remove(entry)
                    fut.set_result([q.items.popleft()])  # records (item, weight): a get given up puts them back
                    progressed = True
                else:
                    full = bool(self._maxsize) and len(q.items) >= self._maxsize
                    batch = ChannelServer._take_batch(q, target, full)
                    if batch is not None:
                        q.getters.remove(entry)
                        fut.set_result(batch)
                        progressed = True
        if not q.items and not q.getters and not q.putters and not q.held:
            del self._queues[token]

    def _has_room(self, q: _Queue) -> bool:
        return not self._maxsize or len(q.items) + q.held < self._maxsize

    def _commit(self, token: str, q: _Queue, record: tuple, released: list) -> None:
        """A blocking put served while it waited returns: its item (``record``) joins the queue.

        ``released[0]`` says the place it held was given back (nothing that
        can take an interrupt runs between the two), so that ``_withdraw``
        knows what an interrupt inside this left done."""
        with self._lock:
            q.held -= 1
            released[0] = True
            q.items.append(record)
            self._progress(token)

    def _withdraw(self, token: str, q: _Queue, entry, fut: concurrent.futures.Future, record: tuple,
                  released: list) -> None:
        """A blocking put raised (interrupted, timed out): take it back, whether it waits, was served,
        or was interrupted inside ``_commit`` (its item is taken out again unless a consumer has it)."""
        with self._lock:
            try:
                q.putters.remove(entry)
            except ValueError:  # served, or expired
                if released[0]:
                    for i, queued in enumerate(q.items):
                        if queued is record:
                            del q.items[i]
                            break
                elif entry[3] and fut.done() and fut.exception() is None:
                    q.held -= 1  # served: the place it held is free again (an async one's item is already queued)
            self._progress(token)

    # -- operations -------------------------------------------------------------
    def put(self, item: Any, weight: float = 0, key: Any = "default_queue", async_op: bool = False,
            timeout: Optional[float] = None):
        token = key_token(key)
        timeout = None if async_op and timeout is None else config.resolve_timeout(timeout)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        what = f"put on channel {self._name!r} key {show_key(token)}"
        record, released, done, entry = (item, float(weight)), [False], False, None
        try:  # an interrupt anywhere after it parked and before its commit completed withdraws the put
            with self._lock:
                q = self._queues.setdefault(token, _Queue())
                if self._has_room(q) and not q.putters:
                    q.items.append(record)
                    fut.set_result(None)
                else:
                    entry = (fut, item, record[1], not async_op)
                    q.putters.append(entry)
                self._progress(token)
            if async_op or entry is None:
                work = self._finish(fut, q.putters, entry, async_op, timeout, what, put=True)
                done = True
                return work
            self._finish(fut, q.putters, entry, async_op, timeout, what)
            self._commit(token, q, record, released)
            done = True
        finally:
            if not done and entry is not None:
                self._withdraw(token, q, entry, fut, record, released)

    def put_nowait(self, item: Any, weight: float = 0, key: Any = "default_queue") -> None:
        token = key_token(key)
        with self._lock:
            q = self._queues.setdefault(token, _Queue())
            if not self._has_room(q) or q.putters:
                raise asyncio.QueueFull(f"channel {self._name!r} key {show_key(token)} is full ({self._maxsize} items)")
            q.items.append((item, float(weight)))
            self._progress(token)

    def get(self, key: Any = "default_queue", async_op: bool = False, timeout: Optional[float] = None):
        return self._get(key, None, async_op, timeout)

    def get_nowait(self, key: Any = "default_queue"):
        token = key_token(key)
        with self._lock:
            q = self._queues.get(token)
            if q is None or not q.items:
                raise asyncio.QueueEmpty(f"channel {self._name!r} key {show_key(token)} is empty")
            item = q.items.popleft()[0]
            self._progress(token)
            return item

    def get_batch(self, target_weight: float, key: Any = "default_queue", async_op: bool = False,
                  timeout: Optional[float] = None):
        if isinstance(target_weight, bool) or not isinstance(target_weight, (int, float)) or target_weight <= 0:
            raise ValueError(f"target_weight must be a positive number, got {target_weight!r}")
        return self._get(key, float(target_weight), async_op, timeout)

    def _get(self, key, target: Optional[float], async_op: bool, timeout: Optional[float]):
        token = key_token(key)
        timeout = None if async_op and timeout is None else config.resolve_timeout(timeout)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        entry = (fut, target)
        with self._lock:
            q = self._queues.setdefault(token, _Queue())
            if target is not None and q.items and q.items[0][1] > target and not q.getters:
                self._progress(token)
                raise ValueError(f"the next item on key {show_key(token)} weighs {q.items[0][1]}, more than "
                                 f"target_weight {target}")
            q.getters.append(entry)
            self._progress(token)
        op = "get" if target is None else "get_batch"
        what = f"{op} on channel {self._name!r} key {show_key(token)}"
        unpack = _first_item if target is None else _items

        def give_back() -> None:
            self._give_back(token, q, entry, fut)

        if async_op:
            self._finish(fut, q.getters, entry, async_op, timeout, what)  # starts its timer, if it has a timeout
            return TakeWork(fut, what, unpack, give_back)
        taken = False
        try:  # an interrupt before the records are taken gives them back (or withdraws the get)
            records = self._finish(fut, q.getters, entry, async_op, timeout, what)
            taken = True
        finally:
            if not taken:
                give_back()
        return unpack(records)

    def _give_back(self, token: str, q: _Queue, entry, fut: concurrent.futures.Future) -> None:
        """A get given up (interrupted, or its work dropped untaken): withdraw it if it still waits, or
        put what it was served back at the head of the queue (at-least-once, as on a hosted channel)."""
        with self._lock:
            try:
                q.getters.remove(entry)
            except ValueError:  # served, or expired
                if fut.done() and fut.exception() is None:
                    q = self._queues.setdefault(token, q)  # the same queue, unless it was emptied and forgotten
                    q.items.extendleft(reversed(fut.result()))
            self._progress(token)

    def qsize(self, key: Any = "default_queue") -> int:
        with self._lock:
            q = self._queues.get(key_token(key))
            return len(q.items) if q else 0

    def empty(self, key: Any = "default_queue") -> bool:
        return self.qsize(key) == 0

    def full(self, key: Any = "default_queue") -> bool:
        with self._lock:
            q = self._queues.get(key_token(key))
            return q is not None and not self._has_room(q)
