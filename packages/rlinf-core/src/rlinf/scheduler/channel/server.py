"""The channel host: named FIFO queues served to any number of clients.

Each client connection has one reader thread; all queue state sits behind
one lock.  A request that cannot be served yet (a get on an empty queue, a
put on a full one) is parked with its deadline, and served as soon as the
state allows, so one connection can have many requests in flight and a
blocked get never holds up a put.  Replies are sent outside the lock.
Queues of keys that are empty and unwaited are dropped, so bookkeeping does
not grow with the number of keys ever used.

Nothing is lost and nothing hangs:

* the host owns (copies) every item it keeps, so a producer's shared memory
  is never pinned by a queued, parked or in-flight item;
* an item sent to a consumer stays *in flight* on its connection until the
  client acknowledges handing it to its user; a cancelled request, or a
  connection that goes away, puts its in-flight items back at the head of
  their queues, in order;
* every send has a deadline: a client that does not take its replies for
  that long, or that has not been heard from for several heartbeats, is
  treated as dead (its link is closed, which ends its reader thread and
  puts its items back);
* a departed client's link, thread and state are released.
"""

from __future__ import annotations

import collections
import mmap
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Optional

from ..p2p.transport import Link
from .keys import show_key
from .protocol import DEAD_AFTER_BEATS, control, heartbeat_interval, pack, send_timeout


@dataclass
class _Waiter:
    conn: "_Conn"
    rid: int
    op: str
    deadline: Optional[float]
    frames: list = field(default_factory=list)  # the item, for a parked put
    weight: float = 0.0
    target: float = 0.0  # for get_batch


@dataclass
class _Queue:
    items: collections.deque = field(default_factory=collections.deque)  # (frames, weight)
    getters: collections.deque = field(default_factory=collections.deque)
    putters: collections.deque = field(default_factory=collections.deque)


#: queued frames at least this large live in anonymous mappings, not on the heap
_MAPPED_MIN = 1 << 16
#: bytes of such mappings kept for reuse once their items are consumed
_POOL_BYTES = 64 << 20


class _BlockPool:
    """Anonymous mappings for queued frames, reused by size.

    Mappings go back to the system when not reused (the heap would keep a
    burst of queued items resident long after they were consumed), and
    recycling them keeps a steady stream free of page faults.
    """

    def __init__(self):
        self._free: dict[int, list] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, size: int):
        with self._lock:
            blocks = self._free.get(size)
            if blocks:
                self._bytes -= size
                return blocks.pop()
        return mmap.mmap(-1, size)

    def give_back(self, frames) -> None:
        for f in frames:
            if isinstance(f, mmap.mmap):
                with self._lock:
                    if self._bytes + len(f) <= _POOL_BYTES:
                        self._free.setdefault(len(f), []).append(f)
                        self._bytes += len(f)
                        continue
                try:
                    f.close()
                except BufferError:
                    # a send that already copied it out may still hold a view for an instant (the
                    # client can acknowledge before that send returns): unmapped when the view goes
                    pass


def _own(frames: list, pool: _BlockPool) -> list:
    """Copy frames that view a producer's shared memory, so a queued item does
    not pin the producer's segment (which it would otherwise have to replace)."""
    out = []
    for f in frames:
        if isinstance(f, (bytes, bytearray, mmap.mmap)):
            out.append(f)
            continue
        view = memoryview(f).cast("B")
        if view.nbytes >= _MAPPED_MIN:
            block = pool.take(view.nbytes)
            block[:] = view
            out.append(block)
        else:
            out.append(bytearray(view))
    return out


class _Conn:
    """One client's connection: its link and the items sent to it but not yet acknowledged."""

    def __init__(self, link: Link, name: str):
        self.link = link
        self.name = name
        self.alive = True
        self.last_heard = time.monotonic()
        #: request id -> (key, [(frames, weight), ...]) sent and not yet acknowledged
        self.inflight: dict[int, tuple[str, list]] = {}

    def send(self, ctrl: dict, frames, timeout: float) -> bool:
        """Send with a deadline; False (and the link closed) if the client did not take it in time."""
        if not self.alive:
            return False
        try:
            self.link.send([pack(ctrl), *frames], time.monotonic() + timeout)
            return True
        except Exception:
            self.kill()
            return False

    def kill(self) -> None:
        """Close the link: the reader thread then ends and hands back what the client held."""
        self.alive = False
        try:
            self.link.close()
        except Exception:
            pass


class ChannelServer:
    def __init__(self, name: str, maxsize: int):
        self.name = name
        self.maxsize = maxsize
        self._queues: dict[str, _Queue] = {}
        self._conns: set = set()
        self._lock = threading.Lock()
        self._timer = threading.Condition(self._lock)
        self._blocks = _BlockPool()
        self._send_timeout = send_timeout()
        self._dead_after = DEAD_AFTER_BEATS * heartbeat_interval()
        threading.Thread(target=self._expire_loop, name=f"rlinf-channel-{name}-timeouts", daemon=True).start()

    # -- connections -------------------------------------------------------------
    def on_connect(self, link: Link, info: dict) -> None:
        conn = _Conn(link, str(info.get("client", "?")))
        with self._lock:
            self._conns.add(conn)
        threading.Thread(target=self._serve, args=(conn,), name=f"rlinf-channel-{self.name}-client", daemon=True).start()

    def _serve(self, conn: _Conn) -> None:
        while True:
            try:
                # no deadline: a silent client is closed by the heartbeat check in _expire_loop, which ends this wait
                _raw, frames = conn.link.recv(None)
            except Exception:
                conn.kill()
                self._deliver(self._drop_connection(conn))
                return
            conn.last_heard = time.monotonic()
            ctrl: dict = {}
            try:
                ctrl = control(frames[0])
                replies = self._handle(conn, ctrl, frames[1:])
            except Exception as exc:
                replies = [(conn, {"id": ctrl.get("id", -1), "error": "ChannelError",
                                   "message": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}, ())]
            self._deliver(replies)

    def _deliver(self, replies: list) -> None:
        for target, reply, frames in replies:
            target.send(reply, frames, self._send_timeout)

    def _drop_connection(self, conn: _Conn) -> list:
        """Forget a departed client: drop its parked gets, keep its parked puts, put its in-flight items back."""
        out: list = []
        with self._lock:
            self._conns.discard(conn)
            conn.alive = False
            inflight, conn.inflight = conn.inflight, {}
            touched = set()
            for key, q in list(self._queues.items()):
                q.getters = collections.deque(w for w in q.getters if w.conn is not conn)
                kept = collections.deque()
                for w in q.putters:
                    if w.conn is conn:  # a parked put from a vanished client is still the user's data
                        q.items.append((w.frames, w.weight))
                    else:
                        kept.append(w)
                q.putters = kept
                touched.add(key)
            for rid in sorted(inflight, reverse=True):  # newest first: the oldest ends up at the head
                key, items = inflight[rid]
                self._requeue(key, items)
                touched.add(key)
            for key in touched:
                out.extend(self._progress(key))
        return out

    def _requeue(self, key: str, items: list) -> None:
        """Put items that left but were not taken back at the head of ``key``'s queue (lock held)."""
        q = self._queues.setdefault(key, _Queue())
        for item in reversed(items):
            q.items.appendleft(item)

    # -- requests ------------------------------------------------------------------
    def _handle(self, conn: _Conn, ctrl: dict, item: list) -> list:
        op, rid = ctrl["op"], ctrl.get("id", 0)
        acks = ctrl.get("ids") if op == "ack" else ctrl.get("acks")
        if acks:
            with self._lock:
                done = [conn.inflight.pop(i, None) for i in acks]
            for entry in done:
                if entry is not None:
                    for frames, _ in entry[1]:
                        self._blocks.give_back(frames)
        if op == "ack":
            return []
        if op == "ping":
            return [(conn, {"id": 0, "op": "pong"}, ())]
        if op == "bye":  # the client closes once answered: everything it sent before has been handled
            return [(conn, {"id": rid}, ())]
        key = str(ctrl.get("key", "default_queue"))
        timeout = ctrl.get("timeout")
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        if op == "put":
            item = _own(item, self._blocks)  # copied before the lock: never pins the producer's memory
        out: list = []
        with self._lock:
            q = self._queues.get(key)
            if op == "qsize":
                out.append((conn, {"id": rid, "value": len(q.items) if q else 0}, ()))
            elif op == "full":
                out.append((conn, {"id": rid, "value": bool(self.maxsize) and q is not None and len(q.items) >= self.maxsize}, ()))
            elif op == "cancel":
                key = self._cancel(conn, ctrl["target"])
                if key is None:
                    return out
            elif op == "put":
                q = q or self._queues.setdefault(key, _Queue())
                waiter = _Waiter(conn, rid, op, deadline, item, float(ctrl.get("weight", 0)))
                if not self.maxsize or len(q.items) < self.maxsize and not q.putters:
                    q.items.append((item, waiter.weight))
                    out.append((conn, {"id": rid}, ()))
                elif ctrl.get("nowait"):
                    self._blocks.give_back(item)
                    out.append((conn, {"id": rid, "error": "QueueFull", "message": f"channel {self.name!r} key {show_key(key)} is full ({self.maxsize} items)"}, ()))
                else:
                    q.putters.append(waiter)
                    self._deadline_added(deadline)
            elif op in ("get", "get_batch"):
                q = q or self._queues.setdefault(key, _Queue())
                waiter = _Waiter(conn, rid, op, deadline, target=float(ctrl.get("target", 0)))
                if op == "get_batch" and q.items and q.items[0][1] > waiter.target and not q.getters:
                    out.append((conn, {"id": rid, "error": "ValueError", "message":
                                       f"the next item on key {show_key(key)} weighs {q.items[0][1]}, more than target_weight {waiter.target}"}, ()))
                elif ctrl.get("nowait") and not q.items:
                    out.append((conn, {"id": rid, "error": "QueueEmpty", "message": f"channel {self.name!r} key {show_key(key)} is empty"}, ()))
                else:
                    q.getters.append(waiter)
                    self._deadline_added(deadline)
            else:
                raise ValueError(f"unknown channel operation {op!r}")
            out.extend(self._progress(key))
        return out

    def _deadline_added(self, deadline: Optional[float]) -> None:
        if deadline is not None:
            self._timer.notify_all()

    def _send_items(self, w: _Waiter, key: str, items: list) -> tuple:
        """A reply carrying ``items`` to ``w``; they stay in flight on its connection until acknowledged."""
        w.conn.inflight[w.rid] = (key, items)
        frames = [f for item, _ in items for f in item]
        return (w.conn, {"id": w.rid, "count": len(items), "sizes": [len(item) for item, _ in items]}, frames)

    def _progress(self, key: str) -> list:
        """Serve whatever the state of ``key`` now allows (called with the lock held)."""
        q = self._queues.get(key)
        out: list = []
        if q is None:
            return out
        progressed = True
        while progressed:
            progressed = False
            while q.putters and (not self.maxsize or len(q.items) < self.maxsize):
                w = q.putters.popleft()
                q.items.append((w.frames, w.weight))
                out.append((w.conn, {"id": w.rid}, ()))
                progressed = True
            for w in list(q.getters):
                if not q.items:
                    break
                if w.op == "get":
                    q.getters.remove(w)
                    out.append(self._send_items(w, key, [q.items.popleft()]))
                    progressed = True
                else:
                    full = bool(self.maxsize) and len(q.items) >= self.maxsize
                    batch = self._take_batch(q, w.target, full)
                    if batch is not None:
                        q.getters.remove(w)
                        out.append(self._send_items(w, key, batch))
                        progressed = True
        self._maybe_forget(key)
        return out

    @staticmethod
    def _take_batch(q: _Queue, target: float, full: bool = False) -> Optional[list]:
        """The longest FIFO prefix weighing at most ``target``, once it can grow no further.

        It can grow no further when it reaches the target, when the next item
        would exceed the target, or when the queue is full (a bounded queue
        at its ``maxsize`` cannot take the items that would complete it).
        """
        total, n = 0.0, 0
        for _, weight in q.items:
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
        if q is not None and not q.items and not q.getters and not q.putters:
            del self._queues[key]

    def _cancel(self, conn: _Conn, target: int) -> Optional[str]:
        """Drop a parked request of ``conn``, or put back the items already sent for it; the key to progress."""
        entry = conn.inflight.pop(target, None)
        if entry is not None:
            self._requeue(*entry)
            return entry[0]
        for key, q in self._queues.items():
            for waiters in (q.getters, q.putters):
                for w in waiters:
                    if w.conn is conn and w.rid == target:
                        waiters.remove(w)
                        if w.op == "put":  # its caller was told it failed (timed out, interrupted): it did not happen
                            self._blocks.give_back(w.frames)
                        return key
        return None

    def stats(self) -> dict:
        with self._lock:
            return {"keys": len(self._queues), "items": sum(len(q.items) for q in self._queues.values()),
                    "clients": len(self._conns), "in_flight": sum(len(c.inflight) for c in self._conns)}

    def describe(self, max_keys: int = 200) -> dict:
        """Read-only, for ``python -m rlinf.scheduler status``: per key its queued items, parked gets and puts."""
        with self._lock:
            keys = [{"key": show_key(k), "items": len(q.items), "getters": len(q.getters), "putters": len(q.putters)}
                    for k, q in self._queues.items()]
            clients, in_flight = len(self._conns), sum(len(c.inflight) for c in self._conns)
        keys.sort(key=lambda k: (-k["items"] - k["getters"] - k["putters"], k["key"]))
        return {"name": self.name, "maxsize": self.maxsize, "clients": clients, "in_flight": in_flight,
                "num_keys": len(keys), "keys": keys[:max_keys]}

    # -- timeouts and dead clients -----------------------------------------------------
    def _expire_loop(self) -> None:
        while True:
            out, silent = [], []
            with self._timer:
                now = time.monotonic()
                soonest = None
                for key, q in list(self._queues.items()):
                    for waiters in (q.getters, q.putters):
                        for w in list(waiters):
                            if w.deadline is None:
                                continue
                            if w.deadline <= now:
                                waiters.remove(w)
                                if w.op == "put":
                                    self._blocks.give_back(w.frames)
                                out.append((w.conn, {"id": w.rid, "error": "Timeout", "message": "timed out waiting"}, ()))
                            elif soonest is None or w.deadline < soonest:
                                soonest = w.deadline
                    self._maybe_forget(key)
                silent = [c for c in self._conns if now - c.last_heard > self._dead_after]
                if not out and not silent:
                    self._timer.wait(0.5 if soonest is None else min(0.5, max(0.001, soonest - now)))
            for conn in silent:  # its reader thread then drops it
                conn.kill()
            self._deliver(out)
