"""The channel host: named FIFO queues served to any number of clients.

Each client connection has one reader thread; all queue state sits behind
one lock.  A request that cannot be served yet (a get on an empty queue, a
put on a full one) is parked with its deadline, and served as soon as the
state allows, so one connection can have many requests in flight and a
blocked get never holds up a put.  Replies are sent outside the lock.
Queues of keys that are empty and unwaited are dropped, so bookkeeping does
not grow with the number of keys ever used.
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
from .protocol import control, pack


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
                f.close()


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
    def __init__(self, link: Link, name: str):
        self.link = link
        self.name = name
        self.alive = True

    def reply(self, ctrl: dict, frames=()) -> None:
        if not self.alive:
            return
        try:
            self.link.send([pack(ctrl), *frames], None)
        except Exception:
            self.alive = False


class ChannelServer:
    def __init__(self, name: str, maxsize: int):
        self.name = name
        self.maxsize = maxsize
        self._queues: dict[str, _Queue] = {}
        self._lock = threading.Lock()
        self._timer = threading.Condition(self._lock)
        self._blocks = _BlockPool()
        threading.Thread(target=self._expire_loop, name=f"rlinf-channel-{name}-timeouts", daemon=True).start()

    # -- connections -------------------------------------------------------------
    def on_connect(self, link: Link, info: dict) -> None:
        conn = _Conn(link, str(info.get("client", "?")))
        threading.Thread(target=self._serve, args=(conn,), name=f"rlinf-channel-{self.name}-client", daemon=True).start()

    def _serve(self, conn: _Conn) -> None:
        while True:
            try:
                _raw, frames = conn.link.recv(None)
            except Exception:
                conn.alive = False
                self._drop_connection(conn)
                return
            ctrl: dict = {}
            try:
                ctrl = control(frames[0])
                replies = self._handle(conn, ctrl, frames[1:])
            except Exception as exc:
                replies = [(conn, {"id": ctrl.get("id", -1), "error": "ChannelError",
                                   "message": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}, ())]
            for target, reply, item in replies:
                target.reply(reply, item)
                self._blocks.give_back(item)

    def _drop_connection(self, conn: _Conn) -> None:
        with self._lock:
            for key, q in list(self._queues.items()):
                q.getters = collections.deque(w for w in q.getters if w.conn is not conn)
                kept = collections.deque()
                for w in q.putters:
                    if w.conn is conn:  # a parked put from a vanished client is still the user's data
                        q.items.append((w.frames, w.weight))
                    else:
                        kept.append(w)
                q.putters = kept
                self._maybe_forget(key)

    # -- requests ------------------------------------------------------------------
    def _handle(self, conn: _Conn, ctrl: dict, item: list) -> list:
        op, rid = ctrl["op"], ctrl["id"]
        key = str(ctrl.get("key", "default_queue"))
        timeout = ctrl.get("timeout")
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        out: list = []
        with self._lock:
            q = self._queues.get(key)
            if op == "qsize":
                out.append((conn, {"id": rid, "value": len(q.items) if q else 0}, ()))
            elif op == "full":
                out.append((conn, {"id": rid, "value": bool(self.maxsize) and q is not None and len(q.items) >= self.maxsize}, ()))
            elif op == "cancel":
                self._cancel(conn, ctrl["target"])
            elif op == "put":
                q = q or self._queues.setdefault(key, _Queue())
                waiter = _Waiter(conn, rid, op, deadline, item, float(ctrl.get("weight", 0)))
                if not self.maxsize or len(q.items) < self.maxsize and not q.putters:
                    q.items.append((item if q.getters else _own(item, self._blocks), waiter.weight))
                    out.append((conn, {"id": rid}, ()))
                elif ctrl.get("nowait"):
                    out.append((conn, {"id": rid, "error": "QueueFull", "message": f"channel {self.name!r} key {key!r} is full ({self.maxsize} items)"}, ()))
                else:
                    waiter.frames = _own(item, self._blocks)
                    q.putters.append(waiter)
                    self._deadline_added(deadline)
            elif op in ("get", "get_batch"):
                q = q or self._queues.setdefault(key, _Queue())
                waiter = _Waiter(conn, rid, op, deadline, target=float(ctrl.get("target", 0)))
                if op == "get_batch" and q.items and q.items[0][1] > waiter.target and not q.getters:
                    out.append((conn, {"id": rid, "error": "ValueError", "message":
                                       f"the next item on key {key!r} weighs {q.items[0][1]}, more than target_weight {waiter.target}"}, ()))
                elif ctrl.get("nowait") and not q.items:
                    out.append((conn, {"id": rid, "error": "QueueEmpty", "message": f"channel {self.name!r} key {key!r} is empty"}, ()))
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
                    frames, _ = q.items.popleft()
                    q.getters.remove(w)
                    out.append((w.conn, {"id": w.rid, "count": 1, "sizes": [len(frames)]}, frames))
                    progressed = True
                else:
                    batch = self._take_batch(q, w.target)
                    if batch is not None:
                        q.getters.remove(w)
                        frames = [f for item, _ in batch for f in item]
                        out.append((w.conn, {"id": w.rid, "count": len(batch), "sizes": [len(item) for item, _ in batch]}, frames))
                        progressed = True
        self._maybe_forget(key)
        return out

    @staticmethod
    def _take_batch(q: _Queue, target: float) -> Optional[list]:
        """The longest FIFO prefix weighing at most ``target``, once it can grow no further."""
        total, n = 0.0, 0
        for _, weight in q.items:
            if total + weight > target:
                break
            total += weight
            n += 1
            if total >= target:
                break
        else:
            if total < target:
                return None  # more items may come and fit
        if n == 0:
            return None
        return [q.items.popleft() for _ in range(n)]

    def _maybe_forget(self, key: str) -> None:
        q = self._queues.get(key)
        if q is not None and not q.items and not q.getters and not q.putters:
            del self._queues[key]

    def _cancel(self, conn: _Conn, target: int) -> None:
        for q in self._queues.values():
            q.getters = collections.deque(w for w in q.getters if not (w.conn is conn and w.rid == target))

    def stats(self) -> dict:
        with self._lock:
            return {"keys": len(self._queues), "items": sum(len(q.items) for q in self._queues.values())}

    # -- timeouts --------------------------------------------------------------------
    def _expire_loop(self) -> None:
        while True:
            out = []
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
                                out.append((w.conn, {"id": w.rid, "error": "Timeout", "message": "timed out waiting"}, ()))
                            elif soonest is None or w.deadline < soonest:
                                soonest = w.deadline
                    self._maybe_forget(key)
                if not out:
                    self._timer.wait(0.5 if soonest is None else min(0.5, max(0.001, soonest - now)))
            for conn, reply, frames in out:
                conn.reply(reply, frames)
                self._blocks.give_back(frames)
