"""Feeds on the client side: items a host sends ahead for blocking gets (a part of ``client.ChannelClient``).

A blocking get on a channel without ``maxsize`` asks for a feed; the host
grants it when this connection is the key's only consumer (see ``queues``),
and then sends the key's items ahead as they come.  They wait here, in a
buffer per key, until a get takes one: the get then costs no request and no
round trip, only the acknowledgement that is sent before it returns (so an
item is delivered once, whatever happens to the process).

The buffer is filled by whichever thread reads the connection: a waiting get
reads itself when no one else does (no hand-over between threads).  Items
the user has not taken go back to the host, which puts them back in their
places in the queue, when the host recalls the feed (another consumer came),
when the feed has been idle for ``FEED_IDLE`` seconds, before any other kind
of take on the key (an asynchronous get, ``get_batch``, ``get_nowait`` that
finds nothing here), and when the connection ends (the host puts back what
was in flight).
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Optional

from ...base.errors import PeerDiedError
from .protocol import DIRECT_BASE

#: the most items a feed holds ahead (the host may hold it to fewer, and to about 1 MiB per message)
FEED_WINDOW = 32
#: seconds without a get after which a feed is ended and its items go back
FEED_IDLE = 5.0


class _Feed:
    __slots__ = ("buffer", "used")

    def __init__(self):
        self.buffer: collections.deque = collections.deque()  # (item id, frames), oldest first
        self.used = time.monotonic()


class _Feeds:
    """The feed side of ``ChannelClient`` (uses its link, reader turn and failure handling)."""

    def _init_feeds(self) -> None:
        self._feeds: dict[str, _Feed] = {}
        self._fed_cond = threading.Condition(threading.Lock())
        self._fed_waiting = 0
        #: (control, frames) to send (returns, and what direct routes tell the host): after the read burst
        #: that made them, before any later message, or on a heartbeat tick; one that cannot go now stays
        #: queued (never dropped: its items would stay in flight)
        self._returns: collections.deque = collections.deque()
        self._returns_lock = threading.Lock()  # held across taking a return, sending it and keeping it if it failed
        self._fed_until = 0.0  # until then fed items of an ended feed may still come: the heartbeat reads

    def _route_feed(self, ctrl: dict, frames) -> None:
        """A message about a feed: items fed ahead, a recall, or a get's reply that grants a feed."""
        key, op = ctrl["key"], ctrl.get("op")
        with self._fed_cond:
            feed = self._feeds.get(key)
            if op == "fed":
                if feed is None:  # it ended here while these were on their way: they go back
                    self._queue_return(key, [(rid, None) for rid in ctrl["ids"]], False)
                    return
                pos = 0
                for rid, n in zip(ctrl["ids"], ctrl["sizes"]):
                    feed.buffer.append((rid, frames[pos:pos + n]))
                    pos += n
            elif op == "recall":
                if feed is None:
                    return
                del self._feeds[key]
                self._fed_until = time.monotonic() + FEED_IDLE
                if feed.buffer:
                    self._queue_return(key, list(feed.buffer), False)
            elif feed is None:
                self._feeds[key] = _Feed()
                self._offer_ack_link()  # now, not on the next heartbeat tick: acks wake no one from then on
            if self._fed_waiting:
                self._fed_cond.notify_all()

    def _send_returns(self, limit: Optional[float] = None, when_idle: bool = False) -> bool:
        """Send the queued returns, in order; False if some are still queued (another send held the link,
        or another thread is sending them: a message that must follow them waits, or is not sent)."""
        lock = self._returns_lock
        if not (lock.acquire(False) if when_idle else lock.acquire(timeout=self._send_timeout if limit is None else limit)):
            return False
        try:
            while self._returns:
                ctrl, frames = self._returns[0]
                if not self._send_one_way(ctrl, limit, when_idle, frames):
                    return False  # kept, in order, for the next message or tick
                self._returns.popleft()
            return True
        finally:
            self._returns_lock.release()

    def has_feed(self, key: str) -> bool:
        return key in self._feeds

    def take_fed(self, key: str, deadline: float) -> Optional[tuple]:
        """The oldest item fed ahead on ``key``: ``(item id, frames)``, waiting until ``deadline``.

        None if this connection has no feed on ``key`` (the caller asks the
        host); ``TimeoutError`` if none came by ``deadline``;
        ``PeerDiedError`` if the connection is lost.  The caller acknowledges
        the item (``ack``) before handing it to its user."""
        while True:
            got = None
            with self._fed_cond:
                if self._dead is not None:
                    raise PeerDiedError(self._dead, peer=self.host)
                feed = self._feeds.get(key)
                if feed is None:
                    return None
                feed.used = time.monotonic()
                if feed.buffer:
                    got = feed.buffer.popleft()
                    low = len(feed.buffer) == FEED_WINDOW // 2
            if got is not None:
                if low:  # half taken: the host refills it while the other half is taken
                    try:
                        self._say_more(key)
                    except BaseException:  # interrupted: the item goes back where it was
                        self._unpop(key, feed, got)
                        raise
                return got
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no item came on key {key!r}")
            if self._claim():
                try:
                    self._say_more(key)
                    self._waiting_key = key  # (see ``direct_in``: how long the read spins)
                    self._read_one(time.monotonic() + min(left, 1.0))  # False: lost (seen above)
                except TimeoutError:
                    pass
                finally:
                    self._waiting_key = None
                    self._release()
                continue
            self._say_more(key)  # another thread reads: the host must still hear that our window is free
            with self._fed_cond:  # the reader wakes us when it routes an item or stops reading
                if self._feeds.get(key) is feed and not feed.buffer and self._dead is None:
                    self._fed_waiting += 1
                    try:
                        self._fed_cond.wait(min(left, 0.5))
                    finally:
                        self._fed_waiting -= 1

    def end_feed(self, key: str, when_idle: bool = False) -> None:
        """End this connection's feed on ``key`` (before another kind of take there): its items go back first."""
        with self._fed_cond:
            feed = self._feeds.pop(key, None)
            if feed is None:
                return
            self._fed_until = time.monotonic() + FEED_IDLE
            self._queue_return(key, list(feed.buffer), True)
        self._send_returns(when_idle=when_idle)

    def _queue_return(self, key: str, items: list, end: bool) -> None:
        """Queue the return of fed items ``(id, frames)`` the user did not get: by id, and direct ones
        (see ``direct_in``) with their bytes, which only this process may still have."""
        direct = [(rid, frames) for rid, frames in items if rid >= DIRECT_BASE]
        if end or len(direct) < len(items):  # first: a feed that ends is ended before direct items come back
            self._returns.append(({"id": 0, "op": "return", "key": key, "ids": [rid for rid, _ in items if rid < DIRECT_BASE],
                                   "end": end}, ()))
        if direct:
            weights = [self._direct_weights.pop(rid, 0.0) for rid, _ in direct]
            self._returns.append(({"id": 0, "op": "dreturn", "key": key, "ids": [rid for rid, _ in direct],
                                   "w": weights, "sizes": [len(f) for _, f in direct]},
                                  [f for _, frames in direct for f in frames]))

    def _unpop(self, key: str, feed: _Feed, got: tuple) -> None:
        """Put an item taken from the buffer back: at its head if the feed goes on, else to the host."""
        with self._fed_cond:
            if self._feeds.get(key) is feed:
                feed.buffer.appendleft(got)
                return
        self.give_back(key, *got)

    def give_back(self, key: str, rid: int, frames) -> None:
        """Return one fed item taken from the buffer and not handed out (its take was interrupted)."""
        self._queue_return(key, [(rid, frames)], False)
        self._send_returns(when_idle=True)  # else with the next message or tick

    def _wake_fed(self) -> None:
        if self._fed_waiting:
            with self._fed_cond:
                self._fed_cond.notify_all()

    def _tend_feeds(self) -> None:
        """Heartbeat tick: end idle feeds, and read what came (a recall) if no one reads."""
        now = time.monotonic()
        with self._fed_cond:
            idle = [k for k, f in self._feeds.items() if now - f.used > FEED_IDLE and not self._fed_waiting]
        for key in idle:
            self.end_feed(key, when_idle=True)  # this thread never waits behind another send
        if self._returns:
            self._send_returns(when_idle=True)
        if self._feeds or now < self._fed_until:
            self._read_arrived()
