"""Per-key queue bookkeeping of the channel host: queues, parked requests, deadlines.

``_Queue`` is one key's state (its committed items, parked getters and
putters, and the places held by puts not yet committed); ``_Waiter`` is one
parked request.  ``_KeyQueues`` holds the host's operations on that state:
taking, committing and dropping puts, parking and unparking requests with
their deadlines, serving a key as far as its state allows, cancelling and
expiring.  It is a part of ``server.ChannelServer``, which owns the state
(``_queues``, ``maxsize``, ``_timers``, ``_compact_timers_at``, ``_seq``,
``_blocks``) and sends the replies (``_reply``); everything here runs on the
host's loop.  ``_Conn`` is one client's connection as the queues see it (its
parked requests, items in flight, uncommitted puts, feeds); ``server`` imports
this module, never the other way round.

Feeds (channels without ``maxsize``): a blocking get may ask for a *feed*
(``feed``: a window of items).  If its connection is the key's only consumer,
the host grants it with the get's reply, and from then on sends the key's
items ahead to that connection (``fed``, each item with an id of its own, up
to the window unacknowledged), so the client's next gets find their items
there without a request.  Fed items stay in flight (and count in ``qsize``)
until acknowledged; a get from another connection *recalls* the feed (the
client returns the items it has not handed out) and the key is marked shared,
so no feed is granted on it again while the host remembers that.  Every item
carries its sequence in the queue, and one that comes back (returned,
cancelled, its connection lost) goes back to its place by it; while the items
of an ended feed are out, the key's gets wait for them (``RECALL_WAIT`` at the
most), so no consumer gets an item before older ones that were fed ahead.
No feed is served while a get of the key is parked (a ``get_batch`` waiting
for weight goes first).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from .blocks import _own
from .keys import show_key

if TYPE_CHECKING:
    from ...plugins.transport import Link


class _Conn:
    """One client's connection: its link, its outbox, its parked requests and unacknowledged items.

    Everything but the outbox belongs to the loop.  The outbox and the
    ``scheduled`` flag are shared with the senders under ``lock``.
    """

    def __init__(self, link: Link, name: str, token: Optional[str] = None):
        self.link = link
        self.name = name
        self.token = token  # pairs an ack link with this connection
        self.ack_link: Optional[socket.socket] = None  # the client's acknowledgements, read without waiting (``_drain_acks``)
        self.ack_poll = None  # whether bytes came on it (``select.poll``)
        self.ack_left = False  # a drain stopped with bytes maybe still there
        self.ack_rest = b""  # the start of a record split between two reads
        self.alive = True
        self.last_heard = time.monotonic()
        self.fd = getattr(link, "poll_fd", lambda: None)()
        self.last_progress = getattr(link, "last_progress", lambda: 0.0)  # bytes of a long message moving
        #: request id -> (key, [(frames, weight), ...]) sent and not yet acknowledged
        self.inflight: dict[int, tuple[str, list]] = {}
        #: request id -> its parked waiter
        self.parked: dict[int, _Waiter] = {}
        #: request id -> (key, (frames, weight)): puts answered, not yet committed by the client
        self.uncommitted: dict[int, tuple[str, tuple]] = {}
        #: key -> this client's feed on it; fed item id (negative) -> the feed that sent it
        self.feeds: dict[str, _Feed] = {}
        self.fed_by: dict[int, tuple] = {}  # fed item id -> (its feed, its bytes)
        self.fed_ids = itertools.count(-1, -1)
        self.direct: Optional[dict] = None  # where this consumer takes direct routes (see ``routes``)
        self.direct_ok = False  # this producer can send on routes
        self.routes_out: dict = {}  # key -> this producer's route there
        self.routes_in: set = set()  # routes to this consumer
        self.refused: dict = {}  # key -> until when no route is offered there again
        self.lock = threading.Lock()
        self.outbox: collections.deque = collections.deque()  # (control, frames), in order
        self.scheduled = False  # a sender owns the outbox, or the loop waits for the socket to drain
        self.congested_since: Optional[float] = None  # loop: when the socket was found full
        #: loop: dropped, until when its reader thread's last messages are awaited (see ``_lost``)
        self.draining: Optional[float] = None
        self._pollout = None
        if self.fd is not None:
            self._pollout = select.poll()
            self._pollout.register(self.fd, select.POLLOUT)

    def writable(self) -> bool:
        """Whether the socket takes data now (always True for links without a descriptor)."""
        return self._pollout is None or bool(self._pollout.poll(0))



@dataclass(eq=False)
class _Waiter:
    conn: _Conn
    rid: int
    op: str
    key: str
    deadline: Optional[float]
    frames: list = field(default_factory=list)  # the item, for a parked put
    weight: float = 0.0
    target: float = 0.0  # for get_batch
    parked: bool = True  # False once served, cancelled, expired or dropped
    feed: int = 0  # a get asking for a feed of this window
    nowait: bool = False  # a get_nowait waiting for a recalled feed's items: its expiry says QueueEmpty


@dataclass(eq=False)
class _Feed:
    conn: _Conn
    key: str
    window: int
    held: int = 0  # items fed and not yet acknowledged or returned
    held_bytes: int = 0  # their bytes: past FEED_BYTES nothing more is fed (a consumer's memory is not a queue)
    routes: list = field(default_factory=list)  # producers' direct routes to it (see ``routes``)


@dataclass
class _Queue:
    items: collections.deque = field(default_factory=collections.deque)  # (frames, weight, seq), by seq
    getters: collections.deque = field(default_factory=collections.deque)
    putters: collections.deque = field(default_factory=collections.deque)
    uncommitted: int = 0  # items taken from puts whose producers have not committed them yet
    feed: Optional[_Feed] = None  # the connection fed ahead on this key (its only consumer)
    fed: int = 0  # items fed ahead and neither acknowledged nor returned (by any connection)
    routes: int = 0  # direct routes on the key not yet closed (see ``routes``)
    hold_until: float = 0.0  # after a recall: gets wait (until then at most) for the fed items to come back


#: the deadline heap is compacted when it reaches this size (and then twice what was left)
_MIN_TIMERS_COMPACT = 1024
#: seconds a parked ``get_batch`` waits before the host says so, if every item of its key weighs 0 (such
#: items never add up to its target: they were put without ``weight=``); once per request
STALL_NOTE_AFTER = 5.0

#: the most items a feed holds unacknowledged, and the most bytes (but always one item when it holds none)
FEED_WINDOW_MAX = 64
FEED_BYTES = 1 << 20
#: keys remembered as shared by several consumers (no feed is granted on them)
SHARED_KEYS_KEPT = 4096
#: seconds a get_nowait on a key whose items are fed ahead waits for their recall
NOWAIT_RECALL = 1.0
#: seconds the gets of a key wait for the items of its ended feed to come back before they are served anyway
RECALL_WAIT = 5.0

log = logging.getLogger("rlinf.channel")


class _KeyQueues:
    """The channel host's per-key queue operations (see the module docstring)."""

    def _take(self, conn: _Conn, rid: int, key: str, q: _Queue, item: list, weight: float) -> None:
        """Take a put: its item holds a place in ``key``'s queue, seen by consumers once committed."""
        q.uncommitted += 1
        conn.uncommitted[rid] = (key, (item, weight))
        self._reply(conn, {"id": rid} if self.maxsize else {"id": rid, "unbounded": True})

    def _commit(self, conn: _Conn, ids) -> None:
        """The client tells the callers of these puts that they succeeded: their items join their queues
        (in the order of ``ids``), and each key touched is served once."""
        touched = []
        for i in ids:
            entry = conn.uncommitted.pop(i, None)
            if entry is None:
                continue  # cancelled before (its caller was told it failed), or never taken
            key, (frames, weight) = entry
            q = self._queues[key]
            q.uncommitted -= 1
            q.items.append((frames, weight, next(self._item_seq)))
            if key not in touched:
                touched.append(key)
        for key in touched:
            self._progress(key)

    def _drop_uncommitted(self, conn: _Conn, rid: int) -> str:
        """Drop a put taken but not committed (its caller was told it failed); its key, to progress."""
        key, (frames, _) = conn.uncommitted.pop(rid)
        self._queues[key].uncommitted -= 1
        self._blocks.give_back(frames)
        return key

    def _has_room(self, q: _Queue) -> bool:
        return not self.maxsize or len(q.items) + q.uncommitted < self.maxsize

    def _requeue(self, key: str, items: list) -> None:
        """Put items that left but were not taken back into ``key``'s queue where they were: by their
        sequence (at the head, unless items that left later came back first)."""
        q = self._queues.get(key) or self._queues.setdefault(key, _Queue())
        at = 0
        for item in sorted(items, key=lambda it: it[2]):
            while at < len(q.items) and q.items[at][2] < item[2]:
                at += 1
            q.items.insert(at, item)
            at += 1

    def _park(self, waiters: collections.deque, w: _Waiter) -> None:
        waiters.append(w)
        w.conn.parked[w.rid] = w
        if w.deadline is not None:
            if len(self._timers) >= self._compact_timers_at:
                self._compact_timers()
            heapq.heappush(self._timers, (w.deadline, next(self._seq), w))
        if w.op == "get_batch":  # a second entry, before the deadline: the stall note (``_expire``)
            note_at = time.monotonic() + STALL_NOTE_AFTER
            if w.deadline is None or note_at < w.deadline:
                heapq.heappush(self._timers, (note_at, next(self._seq), w))

    def _compact_timers(self) -> None:
        """Drop the deadlines of waiters already served.

        A served waiter's entry stays in the heap until its deadline, and a
        steady stream of gets with a timeout would otherwise keep that many
        entries (and the items of served puts) alive: compacting when the
        heap doubles keeps it proportional to the waiters still parked, at
        amortised constant cost per park.
        """
        self._timers = [e for e in self._timers if e[2].parked]
        heapq.heapify(self._timers)
        self._compact_timers_at = max(_MIN_TIMERS_COMPACT, 2 * len(self._timers))

    def _unpark(self, waiters: collections.deque, w: _Waiter) -> None:
        waiters.remove(w)
        w.parked = False
        w.conn.parked.pop(w.rid, None)

    def _send_items(self, w: _Waiter, items: list, granted: bool = False) -> None:
        """A reply carrying ``items`` to ``w``; they stay in flight on its connection until acknowledged."""
        w.conn.inflight[w.rid] = (w.key, items)
        frames = [f for item in items for f in item[0]]
        ctrl = {"id": w.rid, "count": len(items), "sizes": [len(item[0]) for item in items]}
        if granted:
            ctrl["feed"], ctrl["key"] = True, w.key
        self._reply(w.conn, ctrl, frames)

    def _push(self, ctrl: dict, item: list) -> None:
        """Append a pushed put (one-way, only to a host without maxsize: it always has room) and serve its
        key; or the puts of a batch (``runs``: ``[key, weight, [frames of each item]]``, in order)."""
        runs = ctrl.get("runs")
        if runs is None:
            return self._append(str(ctrl.get("key", "default_queue")), float(ctrl.get("weight", 0)), item)
        runs = [(str(key), float(weight), [int(n) for n in sizes]) for key, weight, sizes in runs]  # all or none
        if sum(sum(sizes) for _k, _w, sizes in runs) != len(item) or any(n < 1 for _k, _w, s in runs for n in s):
            raise ValueError("a batch of pushes whose sizes do not match its frames")
        pos = 0
        for key, weight, sizes in runs:
            for n in sizes:
                self._append(key, weight, item[pos:pos + n])
                pos += n

    def _append(self, key: str, weight: float, item: list) -> None:
        q = self._queues.get(key) or self._queues.setdefault(key, _Queue())
        q.items.append((_own(item, self._blocks), weight, next(self._item_seq)))
        if q.feed is not None and not q.getters:
            self._feed_later.add(key)  # fed at the end of this turn: the pushes read with it go in the same message
        else:
            self._progress(key)

    # -- feeds (see the module docstring) ------------------------------------------------
    def _grant_feed(self, q: _Queue, w: _Waiter) -> bool:
        """Whether ``w``'s connection is fed ahead on its key from now on (the only consumer there)."""
        if self.maxsize or w.key in self._shared or q.feed is not None or w.key in w.conn.feeds:
            return False
        if any(g.conn is not w.conn for g in q.getters):
            self._mark_shared(w.key)
            return False
        q.feed = w.conn.feeds[w.key] = _Feed(w.conn, w.key, max(1, min(int(w.feed), FEED_WINDOW_MAX)))
        return True

    def _feed_ahead(self, q: _Queue, f: _Feed) -> None:
        """Send queued items ahead to ``f``, as many as its window has room for, in one message."""
        if (f.held >= f.window or f.held_bytes >= FEED_BYTES) and f.conn.ack_link is not None:
            self._drain_acks(f.conn, progress=False)  # the acks that make room may be waiting there
        items, sizes = [], []
        # at most the window, and FEED_BYTES held (one item whatever its size when none is): large items
        # go one at a time, so a consumer never holds much more than it asked for
        while q.items and f.held + len(items) < f.window and (f.held_bytes + sum(sizes) < FEED_BYTES
                                                              or not (items or f.held)):
            item = q.items.popleft()
            items.append(item)
            sizes.append(sum(memoryview(frame).nbytes for frame in item[0]))
        if not items:
            return
        ids = []
        for item, n in zip(items, sizes):
            i = next(f.conn.fed_ids)
            f.conn.inflight[i] = (f.key, [item])
            f.conn.fed_by[i] = (f, n)
            ids.append(i)
        f.held += len(items)
        f.held_bytes += sum(sizes)
        q.fed += len(items)
        self._reply(f.conn, {"id": 0, "op": "fed", "key": f.key, "ids": ids, "sizes": [len(it[0]) for it in items]},
                    [frame for it in items for frame in it[0]])

    def _unfeed(self, conn: _Conn, rid: int) -> Optional[_Feed]:
        """A fed item left its connection's flight (acknowledged, returned or put back); its feed."""
        f, n = conn.fed_by.pop(rid, (None, 0))
        if f is not None:
            f.held -= 1
            f.held_bytes -= n
            self._queues[f.key].fed -= 1
        return f

    def _recall(self, q: _Queue, key: str) -> None:
        """End ``key``'s feed: its client returns the items it has not handed out (``return``)."""
        f, q.feed = q.feed, None
        if f is not None:
            f.conn.feeds.pop(key, None)
            self._reply(f.conn, {"id": 0, "op": "recall", "key": key})
            self._drain_acks(f.conn, progress=False)  # what it took already needs no waiting for
            self._end_routes(f)
            self._hold(q, key)

    @staticmethod
    def _held(q: _Queue) -> bool:
        """Whether ``q``'s gets wait for the items of an ended feed (see ``_hold``)."""
        return bool(q.fed or q.routes) and q.feed is None and q.hold_until > time.monotonic()

    def _hold(self, q: _Queue, key: str) -> None:
        """A feed ended: the key's gets wait until its fed items are back (``RECALL_WAIT`` at the most), so
        no item is served before older ones that were fed ahead."""
        if q.fed or q.routes:
            q.hold_until = time.monotonic() + RECALL_WAIT
            heapq.heappush(self._timers, (q.hold_until, next(self._seq), _Waiter(None, 0, "hold", key, q.hold_until)))

    def _mark_shared(self, key: str) -> None:
        self._shared[key] = True
        self._shared.move_to_end(key)
        if len(self._shared) > SHARED_KEYS_KEPT:
            self._shared.popitem(last=False)

    def _end_feed(self, conn: _Conn, key: str) -> None:
        """The client ended its feed on ``key`` itself (idle, or before another kind of take)."""
        f = conn.feeds.pop(key, None)
        q = self._queues.get(key)
        if f is not None and q is not None and q.feed is f:
            q.feed = None
            self._end_routes(f)
            self._hold(q, key)

    def _progress(self, key: str) -> None:
        """Serve whatever the state of ``key`` now allows."""
        q = self._queues.get(key)
        if q is None:
            return
        held = self._held(q)
        progressed = True
        while progressed:
            progressed = False
            while q.putters and self._has_room(q):
                w = q.putters[0]
                self._unpark(q.putters, w)
                self._take(w.conn, w.rid, key, q, w.frames, w.weight)
            for w in list(q.getters):
                if not q.items or held:
                    break
                if w.op == "get":
                    self._unpark(q.getters, w)
                    granted = bool(w.feed) and self._grant_feed(q, w)
                    self._send_items(w, [q.items.popleft()], granted)
                    progressed = True
                else:
                    full = bool(self.maxsize) and len(q.items) >= self.maxsize
                    batch = self._take_batch(q, w.target, full)
                    if batch is not None:
                        self._unpark(q.getters, w)
                        self._send_items(w, batch)
                        progressed = True
        if q.feed is not None and q.items and not q.getters:  # a get_batch parked there goes first
            self._feed_ahead(q, q.feed)
        self._maybe_forget(key)

    @staticmethod
    def _take_batch(q: _Queue, target: float, full: bool = False) -> Optional[list]:
        """The longest FIFO prefix weighing at most ``target``, once it can grow no further.

        It can grow no further when it reaches the target, when the next item
        would exceed the target, or when the queue is full (a bounded queue
        at its ``maxsize`` cannot take the items that would complete it).
        """
        total, n = 0.0, 0
        for item in q.items:  # (frames, weight, ...): the in-process channel's items have no sequence
            weight = item[1]
            if total + weight > target:
                break
            total += weight
            n += 1
            if total >= target:
                break
        else:
            if total < target and not full:
                return None  # more items may come and fit
        if n == 0:
            return None
        return [q.items.popleft() for _ in range(n)]

    def _maybe_forget(self, key: str) -> None:
        q = self._queues.get(key)
        if (q is not None and not q.items and not q.getters and not q.putters and not q.uncommitted
                and q.feed is None and not q.fed and not q.routes):
            del self._queues[key]

    def _cancel(self, conn: _Conn, target: int) -> Optional[str]:
        """Drop a parked request of ``conn`` or a put it did not commit, or put back the items already
        sent for it; the key to progress."""
        entry = conn.inflight.pop(target, None)
        if entry is not None:
            self._unfeed(conn, target)
            self._requeue(*entry)
            return entry[0]
        if target in conn.uncommitted:  # its caller was told it failed: it did not happen
            return self._drop_uncommitted(conn, target)
        w = conn.parked.get(target)
        if w is None:
            return None
        q = self._queues[w.key]
        self._unpark(q.putters if w.op == "put" else q.getters, w)
        if w.op == "put":  # its caller was told it failed (timed out, interrupted): it did not happen
            self._blocks.give_back(w.frames)
        return w.key

    @staticmethod
    def _timed_out(w: _Waiter, q: _Queue) -> str:
        """Why a parked request ran out: for a ``get_batch``, what the key holds and how to fix it."""
        if w.op != "get_batch" or not q.items:
            return "timed out waiting"
        weight = sum(it[1] for it in q.items)
        hint = (" (items put without weight= weigh 0: put(item, weight=...) gives each its weight)"
                if weight == 0 else "")
        return (f"timed out waiting: key {show_key(w.key)} holds {len(q.items)} item(s) of total weight {weight:g}, "
                f"less than target_weight {w.target:g}{hint}")

    def _note_stall(self, w: _Waiter) -> None:
        """Say early, in the host's log, that a ``get_batch`` waits on items that all weigh 0."""
        q = self._queues.get(w.key)
        if q is None or not q.items or any(it[1] for it in q.items):
            return
        log.warning("channel %r: get_batch(target_weight=%g) from %s on key %s has waited %g s: the key holds "
                    "%d item(s) of total weight 0, less than the target, and items put without weight= weigh 0 "
                    "(put(item, weight=...) gives each its weight)", self.name, w.target, w.conn.name,
                    show_key(w.key), STALL_NOTE_AFTER, len(q.items))

    def _expire(self, now: float) -> None:
        while self._timers and self._timers[0][0] <= now:
            _, _, w = heapq.heappop(self._timers)
            if w.op == "hold":  # a recalled feed's items did not all come back in time: serve anyway
                if w.key in self._queues:
                    self._progress(w.key)
                continue
            if not w.parked:
                continue
            if w.deadline is None or now < w.deadline:  # a get_batch's stall note, not its deadline
                self._note_stall(w)
                continue
            q = self._queues[w.key]
            self._unpark(q.putters if w.op == "put" else q.getters, w)
            if w.op == "put":
                self._blocks.give_back(w.frames)
            if w.nowait and q.items:  # a get_nowait that waited for a hold to end: it gets what is there
                self._send_items(w, [q.items.popleft()])
            elif w.nowait:
                self._reply(w.conn, {"id": w.rid, "error": "QueueEmpty",
                                     "message": f"channel {self.name!r} key {show_key(w.key)} is empty"})
            else:
                self._reply(w.conn, {"id": w.rid, "error": "Timeout", "message": self._timed_out(w, q)})
            self._progress(w.key)  # a put that left may let a get_batch or a later put through
