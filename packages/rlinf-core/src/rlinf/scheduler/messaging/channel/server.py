"""The channel host: named FIFO queues served to any number of clients.

A fixed number of threads serves every client, however many connect:

* one event loop owns all queue state (so it needs no lock).  It waits on
  every client connection at once (``selectors``), reads whole requests
  without blocking, serves them, expires deadlines and checks heartbeats;
* a few sender threads (``RLINF_CHANNEL_SENDERS``) write the replies.  Each
  connection has its own outbox, flushed by one sender at a time, so replies
  reach each client in the order the loop made them.  A sender never waits
  on a client whose socket is full: it hands the connection back to the
  loop, which resumes it once the socket drains.  Small replies on a socket
  with room leave from the loop itself (``Link.send_now``, which cannot
  wait), sparing a sender's wake-up per put or get.

State is per key: a full queue or a slow consumer on one key parks only the
requests of that key, and a client that does not read only fills its own
outbox, so producers and consumers of other keys keep their pace.  A request
that cannot be served yet (a get on an empty queue, a put on a full one) is
parked with its deadline and served as soon as the state allows.  Queues of
keys that are empty and unwaited are dropped, so bookkeeping does not grow
with the number of keys ever used.

Connections arrive already authenticated: the transport's handshake gate
(``security.HandshakeGate``, threads bounded for unproven peers) checks the peer before
the link exists, never on the loop.  Links that offer no descriptor to wait
on (``Link.poll_fd`` is None: TCP links with a read-ahead thread, links of
other transports) are read by a thread of their own that hands each request
to the loop.

Nothing is lost and nothing hangs:

* the host owns (copies) every item it keeps, so a producer's shared memory
  is never pinned by a queued, parked or in-flight item;
* a put's item reaches consumers only once its producer commits it: the host
  answers a put it takes, and the client commits the item when it hands that
  answer to its caller.  Until then the item holds a place in the queue (it
  counts toward ``maxsize``) but no consumer sees it, and a cancel or the loss
  of the connection drops it, as it drops a parked put: a put whose caller was
  told it failed (interrupted, timed out, its host declared dead) never
  happened, whatever the host had done with it;
* an item sent to a consumer stays *in flight* on its connection until the
  client acknowledges handing it to its user; a cancelled request, or a
  connection that goes away, puts its in-flight items back at the head of
  their queues, in order;
* every send has a deadline (the send timeout, plus a second per 64 MiB it
  carries): a client that does not take its replies for
  that long (its socket stays full, or one send does not finish), or that has
  not been heard from for several heartbeats (bytes of a long message
  arriving count), is treated as dead: its link
  is closed and its items are put back;
* a departed client's link and state are released.

The per-key queue operations (taking, committing, parking, serving, cancelling
and expiring requests) are in ``queues``; the buffers that queued items own
are in ``blocks``.
"""

from __future__ import annotations

import collections
import itertools
import os
import queue
import selectors
import socket
import threading
import time
import traceback
from typing import Callable, Optional

from ...base import config
from ...plugins.transport import Link
from .blocks import _BlockPool, _own
from .keys import show_key
from .protocol import DEAD_AFTER_BEATS, ROUTE_ITEMS, control, heartbeat_interval, pack, send_limit, send_timeout
from .ack_links import _AckLinks
from .introspection import _Introspection
from .queues import _MIN_TIMERS_COMPACT, NOWAIT_RECALL, _Conn, _KeyQueues, _Queue, _Waiter
from .routes import _ROUTE_OPS, _Routes

#: sender threads of one channel host (replies to all clients)
SENDERS_ENV = "RLINF_CHANNEL_SENDERS"
DEFAULT_SENDERS = 4
#: requests the loop reads from one connection before turning to the others
_READ_BURST = 32
#: microseconds the loop keeps polling, yielding the CPU between polls, after a client's message before
#: it sleeps (a reply or the next request often comes within it, and a sleeping host costs every message
#: a wake-up); 0: never.  By default only where the host may use SPIN_MIN_CPUS CPUs or more: on fewer, the
#: spin takes a core from the workers (2 cores: the routed env-rollout step went from 1.15x to 1.17-1.26x
#: its raw channel operations)
SPIN_ENV, DEFAULT_SPIN_US, SPIN_MIN_CPUS = "RLINF_CHANNEL_SPIN_US", 200.0, 4
_NO_SPIN = ("ping", "ack", "bye")  # messages that no other follows soon
#: seconds between checks for silent and congested connections
_CHECK_EVERY = 0.25
#: seconds a dropped connection read by a thread of its own waits for that thread's last messages
_DRAIN_LIMIT = 5.0


class ChannelServer(_KeyQueues, _Routes, _AckLinks, _Introspection):
    def __init__(self, name: str, maxsize: int):
        self.name = name
        self.maxsize = maxsize
        self._queues: dict[str, _Queue] = {}
        self._shared: collections.OrderedDict = collections.OrderedDict()  # keys seen with several consumers
        self._tokens: dict = {}  # a connection's token -> the connection (to pair its ack link)
        self._pushes: dict = {}  # a push's control bytes -> the control they read as
        self._feed_later: set = set()  # keys pushed to this turn whose feeds are served before the replies go
        self._conns: set = set()
        self._draining: set = set()  # dropped connections whose reader thread has not ended yet
        self._blocks = _BlockPool()
        self._send_timeout = send_timeout()
        self._beat = heartbeat_interval()
        self._dead_after = DEAD_AFTER_BEATS * self._beat
        self._timers: list = []  # heap of (deadline, seq, waiter); served waiters leave it lazily
        self._compact_timers_at = _MIN_TIMERS_COMPACT
        self._seq = itertools.count()
        #: every item's place in its queue, kept when it goes back; a direct route's items take the places
        #: between the one where it started and the next (see ``routes``)
        self._item_seq = itertools.count(0, ROUTE_ITEMS + 1)
        self._init_routes()
        self._inbox: collections.deque = collections.deque()  # callables posted to the loop by other threads
        self._messages = 0  # messages handled, from every client (a put costs one, plus its share of a commit)
        self._again: set = set()  # connections that may hold more requests already read off their socket
        self._to_flush: list = []  # connections with new replies, handed to the senders after this turn
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._sendq: queue.SimpleQueue = queue.SimpleQueue()
        senders = max(1, int(config._float_env(SENDERS_ENV, DEFAULT_SENDERS)))
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        spin = config._finite_env(SPIN_ENV, DEFAULT_SPIN_US if cpus >= SPIN_MIN_CPUS else 0.0)
        self._spin, self._spin_until = max(0.0, spin) / 1e6, 0.0
        for i in range(senders):
            threading.Thread(target=self._sender, name=f"rlinf-channel-{name}-send{i}", daemon=True).start()
        threading.Thread(target=self._loop, name=f"rlinf-channel-{name}-loop", daemon=True).start()

    # -- other threads talk to the loop through its inbox -------------------------------
    def _post(self, fn: Callable, *args) -> None:
        self._inbox.append((fn, args))
        try:
            self._wake_w.send(b"x")
        except (BlockingIOError, InterruptedError):
            pass  # the socket is full of wake-ups already: the loop will look

    def _ask(self, fn: Callable, timeout: float = 10.0):
        """Run ``fn`` on the loop and return its result (bounded: the loop turns at least every 0.25 s)."""
        done = threading.Event()
        out: list = []

        def run():
            try:
                out.append((True, fn()))
            except BaseException as exc:  # handed to the asking thread
                out.append((False, exc))
            done.set()

        self._post(run)
        if not done.wait(timeout):
            raise TimeoutError(f"the loop of channel {self.name!r} did not answer within {timeout:g} s")
        ok, value = out[0]
        if not ok:
            raise value
        return value

    # -- connections -------------------------------------------------------------
    def on_connect(self, link: Link, info: dict) -> None:
        """Called by the transport (on its handshake thread) for each authenticated client."""
        if "acks_for" in info:
            self._post(self._attach_acks, link, str(info["acks_for"]))
            return
        token = info.get("token")
        conn = _Conn(link, str(info.get("client", "?")), token if isinstance(token, str) else None)
        conn.direct_ok = info.get("direct") is True and conn.fd is not None  # it can send on routes
        self._post(self._add, conn)
        if conn.fd is None:
            threading.Thread(target=self._read_thread, args=(conn,), name=f"rlinf-channel-{self.name}-client",
                             daemon=True).start()

    def _add(self, conn: _Conn) -> None:
        self._conns.add(conn)
        if conn.token is not None:
            self._tokens[conn.token] = conn
        if conn.fd is not None:
            try:
                self._selector.register(conn.fd, selectors.EVENT_READ, conn)
            except (KeyError, ValueError, OSError):  # closed before the loop saw it
                self._lost(conn)
                return
            self._again.add(conn)  # its first requests may have been read with the hello

    def _read_thread(self, conn: _Conn) -> None:
        """Reads a link the loop cannot wait on, and hands each request to the loop in order."""
        while True:
            try:
                # no deadline: a silent client is closed by the loop's heartbeat check, which ends this wait
                _raw, frames = conn.link.recv(None)
            except Exception:
                self._post(self._lost, conn, True)  # after everything it read: nothing more will come
                return
            conn.last_heard = time.monotonic()  # heard now, though the loop handles it later (_check_connections)
            self._post(self._on_message, conn, frames)

    def _read(self, conn: _Conn) -> None:
        """Serve the requests that arrived whole on ``conn``, a burst at a time (fair to the others)."""
        for _ in range(_READ_BURST):
            if not conn.alive:
                return
            try:
                msg = conn.link.recv_nowait()
            except Exception:
                self._lost(conn)
                return
            if msg is None:
                self._again.discard(conn)
                return
            self._on_message(conn, msg[1])
            if self._to_flush:  # a reply it made (to it, or to a parked get) leaves now, not after the burst
                self._flush_all()
        self._again.add(conn)  # more may sit in the link's buffer, where the selector cannot see it

    def _lost(self, conn: _Conn, read_all: bool = False) -> None:
        """Forget a departed (or dropped) client: close its link, drop its parked requests and the puts
        it did not commit (their callers were told they failed), put the items sent to it back.

        The commits and acks it sent before it went still count: those
        already here are applied first.  A link that a thread of its own
        reads (``read_all`` once that thread has ended) is closed at once,
        but the connection then drains: the commits and acks its thread
        still hands over are applied, and its uncommitted puts and unacked
        items are settled only when the thread ends (``_DRAIN_LIMIT`` at the
        most)."""
        if conn.draining is not None:
            if read_all:
                self._settle_lost(conn)
            return
        if conn not in self._conns:
            return
        self._read_commits(conn)
        self._drain_acks(conn, progress=False, reads=1 << 14)  # to its end: 1 GiB of acks at the most
        if conn.ack_link is not None:
            conn.ack_link.close()
            conn.ack_link = None
        self._tokens.pop(conn.token, None)
        self._conns.discard(conn)
        self._again.discard(conn)
        conn.alive = False
        if conn.fd is not None:
            try:
                self._selector.unregister(conn.fd)
            except (KeyError, ValueError, OSError):
                pass
        try:
            conn.link.close()  # ends a reader thread, and a sender blocked on it
        except Exception:
            pass
        with conn.lock:
            unsent = {ctrl.get("id") for ctrl, _ in conn.outbox}  # no ack can come for these
            conn.outbox.clear()
        touched = set()
        for w in list(conn.parked.values()):
            w.parked = False
            q = self._queues.get(w.key)
            if q is None:
                continue
            if w.op == "put":
                q.putters.remove(w)
                self._blocks.give_back(w.frames)  # its caller was told it failed (or is gone): it did not happen
            else:
                q.getters.remove(w)
            touched.add(w.key)
        conn.parked.clear()
        for key in list(conn.feeds):
            self._end_feed(conn, key)
        touched |= self._routes_lost(conn)
        if conn.fd is not None or read_all:
            self._settle_lost(conn, touched)
            return
        conn.draining = time.monotonic() + _DRAIN_LIMIT
        self._draining.add(conn)
        self._requeue_sent(conn, [rid for rid in conn.inflight if rid in unsent], touched)
        for key in touched:
            self._progress(key)

    def _settle_lost(self, conn: _Conn, touched: Optional[set] = None) -> None:
        """Drop a lost client's uncommitted puts and put the items sent to it back (``_lost``)."""
        touched = set() if touched is None else touched
        conn.draining = None
        self._draining.discard(conn)
        for rid in list(conn.uncommitted):
            touched.add(self._drop_uncommitted(conn, rid))
        self._requeue_sent(conn, list(conn.inflight), touched)
        for key in touched:
            self._progress(key)

    def _requeue_sent(self, conn: _Conn, rids, touched: set) -> None:
        """Put the items of these replies (or fed items) back, each at the head of its queue, in the order they left."""
        order = {rid: n for n, rid in enumerate(conn.inflight)}
        for rid in sorted((r for r in rids if r in order), key=order.__getitem__, reverse=True):  # newest first
            key, items = conn.inflight.pop(rid)
            self._unfeed(conn, rid)
            self._requeue(key, items)
            touched.add(key)

    def _read_commits(self, conn: _Conn) -> None:
        """Apply the commits and acks a dropped client sent before it went (whole messages already in
        the buffer of a link the loop reads): a put its caller was told succeeded is not dropped with it."""
        if conn.fd is None:
            return  # its reader thread hands over, in order, whatever it read (the connection drains)
        for _ in range(1024):  # bounded: a client does not send more than this after its last reply
            try:
                msg = conn.link.recv_nowait()
            except Exception:
                return
            if msg is None or not self._apply_commits(conn, msg[1]):
                return

    def _apply_commits(self, conn: _Conn, frames: list) -> bool:
        """Apply the acks and commit of one message of a dropped client; False if it does not parse."""
        try:
            ctrl = control(frames[0])
        except Exception:
            return False
        op = ctrl.get("op")
        self._acked(conn, ctrl.get("ids", ()) if op == "ack" else ctrl.get("acks", ()))
        if op == "commit":
            self._commit(conn, ctrl.get("ids", ()))
        elif op == "push" and not self.maxsize:  # a put that returned: it happened
            self._push(ctrl, frames[1:])
        elif op in ("copies", "unrouted"):  # its direct items (see ``routes``)
            self._route_op(conn, op, ctrl, frames[1:])
        return True

    # -- the loop ----------------------------------------------------------------------
    def _loop(self) -> None:
        next_check = time.monotonic() + _CHECK_EVERY
        while True:
            try:
                now = time.monotonic()
                wait = min(next_check, self._timers[0][0] if self._timers else next_check) - now
                if self._again or self._inbox or self._to_flush:  # replies made while flushing go out now
                    wait = 0
                elif now < self._spin_until:  # a client was just heard (SPIN_ENV)
                    wait = 0
                    os.sched_yield()
                # bounded: at most _CHECK_EVERY; a post from another thread wakes it at once
                for key, mask in self._selector.select(max(0.0, wait)):
                    conn = key.data
                    if conn is None:
                        self._drain_wakeups()
                        continue
                    if mask & selectors.EVENT_WRITE:
                        self._drained(conn)
                    if mask & selectors.EVENT_READ:
                        self._read(conn)
                for conn in list(self._again):
                    self._read(conn)
                while self._inbox:
                    fn, args = self._inbox.popleft()
                    fn(*args)
                now = time.monotonic()
                self._expire(now)
                if now >= next_check:
                    next_check = now + _CHECK_EVERY
                    self._check_connections(now)
                while self._feed_later:
                    self._progress(self._feed_later.pop())
                if self._route_later:
                    self._offer_routes()
                self._flush_all()
            except Exception:  # a bug must not end the loop (every client would hang): report it, go on
                traceback.print_exc()

    def _drain_wakeups(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _check_connections(self, now: float) -> None:
        for conn in list(self._draining):
            if now > conn.draining:  # its reader thread did not end (a link whose close does not end a receive)
                self._settle_lost(conn)
        for conn in list(self._conns):
            if conn.ack_link is not None:
                self._drain_acks(conn)  # frees what was acknowledged; refills a feed that made room
            silent = now - conn.last_heard
            # bytes of a long message moving count as heard, sampled from a beat of silence on (see last_progress)
            moved = conn.last_progress() if silent > self._beat else now
            if silent > self._dead_after and now - moved > self._dead_after:
                self._lost(conn)  # a hung or partitioned client
            elif conn.congested_since is not None and now - conn.congested_since > self._send_timeout:
                self._lost(conn)  # it did not take its replies in time

    # -- replies -----------------------------------------------------------------------
    def _reply(self, conn: _Conn, ctrl: dict, frames=()) -> None:
        if not conn.alive:
            return
        with conn.lock:
            conn.outbox.append((ctrl, frames))
            if conn.scheduled:
                return
            conn.scheduled = True
        self._to_flush.append(conn)

    def _flush_all(self) -> None:
        flush, self._to_flush = self._to_flush, []
        for conn in flush:
            if not self._flush_here(conn):
                self._sendq.put(conn)

    def _flush_here(self, conn: _Conn) -> bool:
        """Send ``conn``'s outbox from the loop while each reply can leave at once (``Link.send_now``:
        small, on a socket with room); False hands the rest to a sender thread.

        Waking a sender for a small reply cost more than the reply: on a
        2-core machine a put or get took 366 us with the hand-off and
        about a quarter less without.  The loop still never waits on a client."""
        while True:
            with conn.lock:
                if not conn.outbox or not conn.alive:
                    conn.scheduled = False
                    return True
                ctrl, frames = conn.outbox[0]
            message = [pack(ctrl), *frames]
            try:
                if not conn.link.send_now(message):
                    return False
            except Exception:
                self._lost(conn)  # stays scheduled: nothing more is sent to it
                return True
            with conn.lock:
                conn.outbox.popleft()

    def _sender(self) -> None:
        while True:
            conn = self._sendq.get()  # an idle sender waits here for work: nothing is pending on it
            try:
                self._flush(conn)
            except Exception:
                traceback.print_exc()

    def _flush(self, conn: _Conn) -> None:
        """Send ``conn``'s outbox in order; hand it back to the loop if its socket is full."""
        while True:
            with conn.lock:
                if not conn.outbox or not conn.alive:
                    conn.scheduled = False
                    return
                if not conn.writable():  # stays scheduled: the loop resumes it once the socket drains
                    self._post(self._congested, conn)
                    return
                ctrl, frames = conn.outbox.popleft()
            try:
                conn.link.send([pack(ctrl), *frames], time.monotonic() + send_limit(self._send_timeout, frames))
            except Exception:
                self._post(self._lost, conn)  # stays scheduled: nothing more is sent to it
                return

    def _congested(self, conn: _Conn) -> None:
        if not conn.alive:
            return
        if conn.congested_since is None:
            conn.congested_since = time.monotonic()
        try:
            self._selector.modify(conn.fd, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)
        except (KeyError, ValueError, OSError):
            self._lost(conn)

    def _drained(self, conn: _Conn) -> None:
        conn.congested_since = None
        try:
            self._selector.modify(conn.fd, selectors.EVENT_READ, conn)
        except (KeyError, ValueError, OSError):
            self._lost(conn)
            return
        self._to_flush.append(conn)  # still scheduled: no sender holds it

    # -- requests ------------------------------------------------------------------
    def _on_message(self, conn: _Conn, frames: list) -> None:
        if not conn.alive:
            if conn.draining is not None:  # dropped: its commits and acks still count (see _lost)
                self._apply_commits(conn, frames)
            return
        conn.last_heard = time.monotonic()
        self._messages += 1
        if conn.ack_link is not None:
            self._drain_acks(conn)  # acknowledged before this message was sent
        ctrl: dict = {}
        try:
            head = bytes(frames[0])
            ctrl = self._pushes.get(head) or control(head)
            if ctrl.get("op") == "push" and len(ctrl) == 3 and head not in self._pushes:  # a client's pushes on
                if len(self._pushes) >= 1024:                                              # a key repeat their control
                    self._pushes.clear()
                self._pushes[head] = ctrl  # read only, never changed
            if conn.fd is not None and ctrl.get("op") not in _NO_SPIN:  # the loop reads it: the next one saves a wake-up
                self._spin_until = conn.last_heard + self._spin
            self._handle(conn, ctrl, frames[1:])
        except Exception as exc:
            self._reply(conn, {"id": ctrl.get("id", -1), "error": "ChannelError",
                               "message": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()})

    def _handle(self, conn: _Conn, ctrl: dict, item: list) -> None:
        op, rid = ctrl["op"], ctrl.get("id", 0)
        acks = ctrl.get("ids") if op == "ack" else ctrl.get("acks")
        if acks:
            self._acked(conn, acks)
        if op == "ack":
            return
        if op == "commit":
            return self._commit(conn, ctrl.get("ids", ()))
        if op == "push":
            if self.maxsize:  # a client that never heard the host is unbounded: refused like a bad frame
                raise ValueError(f"a push on channel {self.name!r}, which has a maxsize ({self.maxsize})")
            self._push(ctrl, item)
            if conn.direct_ok:  # offered a route at the end of this turn if its key's queue is left empty
                self._route_later.update((conn, str(k)) for k in ([ctrl.get("key")] if "runs" not in ctrl else [r[0] for r in ctrl["runs"]]))
            return
        if op in _ROUTE_OPS:
            return self._route_op(conn, op, ctrl, item)
        if op == "ping":
            return self._reply(conn, {"id": 0, "op": "pong"})
        if op == "bye":  # the client closes once answered: everything it sent before has been handled
            return self._reply(conn, {"id": rid})
        key = str(ctrl.get("key", "default_queue"))
        if op == "return":  # fed items the client did not hand out (recalled, or its feed ended), in order
            if ctrl.get("end"):
                self._end_feed(conn, key)
            touched = {key}
            self._requeue_sent(conn, [i for i in ctrl.get("ids", ()) if i < 0], touched)
            for k in touched:
                self._progress(k)
            return
        timeout = ctrl.get("timeout")
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        q = self._queues.get(key)
        if op == "more":  # the client acknowledged quietly and waits: its acks were read above
            return self._progress(key)
        if op == "qsize":  # fed items not yet handed out are still queued
            if q is not None and q.fed:
                for c in list(self._conns):  # those that hold its fed items, a recalled feed's included
                    self._drain_acks(c, progress=False)
            return self._reply(conn, {"id": rid, "value": len(q.items) + q.fed if q else 0})
        if op == "full":
            return self._reply(conn, {"id": rid, "value": q is not None and not self._has_room(q)})
        if op == "cancel":
            key = self._cancel(conn, ctrl["target"])
            if key is not None:
                self._progress(key)
            return
        if op == "put":
            item = _own(item, self._blocks)  # never pins the producer's memory
            q = q or self._queues.setdefault(key, _Queue())
            weight = float(ctrl.get("weight", 0))
            if self._has_room(q) and not q.putters:
                self._take(conn, rid, key, q, item, weight)
            elif ctrl.get("nowait"):
                self._blocks.give_back(item)
                return self._reply(conn, {"id": rid, "error": "QueueFull",
                                          "message": f"channel {self.name!r} key {show_key(key)} is full ({self.maxsize} items)"})
            else:
                self._park(q.putters, _Waiter(conn, rid, op, key, deadline, item, weight))
        elif op in ("get", "get_batch"):
            q = q or self._queues.setdefault(key, _Queue())
            if q.feed is not None and (q.feed.conn is not conn or not ctrl.get("feed")):
                if q.feed.conn is not conn:
                    self._mark_shared(key)
                self._recall(q, key)  # its items come back to their places; gets wait for them (a hold)
            target = float(ctrl.get("target", 0))
            held = self._held(q)  # older items are out: the queue's head is not the head yet
            if op == "get_batch" and q.items and q.items[0][1] > target and not q.getters and not held:
                self._reply(conn, {"id": rid, "error": "ValueError", "message":
                                   f"the next item on key {show_key(key)} weighs {q.items[0][1]}, more than target_weight {target}"})
                return self._maybe_forget(key)
            nowait = bool(ctrl.get("nowait"))
            if nowait and (not q.items or held):
                if q.fed or q.routes:  # items fed ahead or sent straight, recalled above or on their way back: wait
                    self._park(q.getters, _Waiter(conn, rid, op, key, time.monotonic() + NOWAIT_RECALL, nowait=True))
                    return
                self._reply(conn, {"id": rid, "error": "QueueEmpty", "message": f"channel {self.name!r} key {show_key(key)} is empty"})
                return self._maybe_forget(key)
            feed = int(ctrl.get("feed", 0)) if op == "get" and not nowait else 0
            if feed and isinstance(ctrl.get("direct"), dict) and conn.fd is not None:
                conn.direct = ctrl["direct"]  # where producers may send it this key's items (see ``routes``)
            self._park(q.getters, _Waiter(conn, rid, op, key, deadline, target=target, feed=feed))
        else:
            raise ValueError(f"unknown channel operation {op!r}")
        self._progress(key)
