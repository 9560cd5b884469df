"""Direct routes on the host (a part of ``server.ChannelServer``; the clients' sides are ``direct_out``
and ``direct_in``).

A *route* lets a producer send a key's items straight to the consumer fed on
that key, over a link of their own, while the host keeps ordering and
counting them.  The host offers one when a producer pushes on a fed key
(``route``, to the producer); the producer
starts it with a later put there (``start``, a request: granted only if the
queue is empty then, and then the host tells the consumer, ``go``, after
every item fed to it before; while items wait there the answer is *later*,
and the producer may ask again), and from then on sends that key's items to the
consumer, each numbered ``n`` = 1, 2, ... on the route.  The consumer treats
them as fed items: it acknowledges each (id ``direct_id(r, n)``) and returns
the ones it does not hand out, with their bytes (``dreturn``).

Nothing is lost with either process: the producer keeps each item until
the consumer says, on their link, that it took it (after its acknowledgement
went to the host).  A route ends when the consumer's feed ends or the
consumer goes (the host says ``unroute``), or the producer ends it (the
consumer left ``ROUTE_WINDOW`` of its items uncredited for a while, or the
link failed, or it was not started in time):
the producer then says how many items it sent (``unrouted``, ``last``) and
sends with it *copies* of the ones it still keeps, which the host holds in
flight to the consumer, drops on the consumer's acknowledgement and puts
back on its return or its death.  An item is *resolved* once, by whichever
of these comes first; the others are ignored.  If the feed goes on when a
route that carried items ends, the host recalls it (the consumer's next get
asks for a new one), so the producer's later items, which come through the
host, cannot overtake the route's.  The
key's gets wait (as for a recalled feed, ``RECALL_WAIT`` at most) while a
route of an ended feed has items not yet resolved.  The route's items all
take their place in the queue where the route started (``seq0``): after the
producer's earlier puts and before its later ones, whatever path they came
back by.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Optional

from .blocks import _own
from .protocol import ROUTE_ITEMS, split_direct
from .queues import _Conn, _Feed, _Queue

#: seconds after a refused start before the producer is offered a route on that key again
REFUSED_PAUSE = 1.0
#: the route messages of clients
_ROUTE_OPS = frozenset(("dreturn", "start", "unrouted", "route_done"))


@dataclass(eq=False)
class _Route:
    r: int
    key: str
    a: _Conn  # the producer
    b: _Conn  # the consumer
    feed: _Feed
    token: str
    started: bool = False
    live: bool = True  # the producer may still send on it
    seq0: int = 0  # where its items stand in the queue (item n at seq0 + n)
    last: Optional[int] = None  # items the producer sent on it (once known)
    got: Optional[int] = None  # items the consumer read on it, once its link ended (``route_done``)
    resolved: int = 0
    copies: dict = field(default_factory=dict)  # n -> item (frames, weight, seq), in flight to the consumer
    done_upto: int = 0  # items 1..done_upto are resolved, and those in ``done`` (the consumer takes them in order)
    done: set = field(default_factory=set)

    def is_done(self, n: int) -> bool:
        return n <= self.done_upto or n in self.done

    def mark_done(self, n: int) -> None:
        if n == self.done_upto + 1:
            self.done_upto = n
            while self.done_upto + 1 in self.done:
                self.done_upto += 1
                self.done.discard(self.done_upto)
        else:
            self.done.add(n)


class _Routes:
    """The host's routes (uses the server's queues, replies, blocks and ``_progress``)."""

    def _init_routes(self) -> None:
        self._routes: dict[int, _Route] = {}
        self._route_ids = iter(range(1, 1 << 29))
        self._route_later: set = set()  # (producer, key) pushed to this turn: offered a route after it

    def _offer_routes(self) -> None:
        """End of a turn: offer a route to each producer that pushed on a fed key (it starts the route once
        nothing waits in the queue there)."""
        later, self._route_later = self._route_later, set()
        now = None
        for a, key in later:
            q = self._queues.get(key)
            if q is None or q.feed is None or q.getters or not a.alive or key in a.routes_out:
                continue
            f = q.feed
            if f.conn is a or f.conn.direct is None or not f.conn.alive:
                continue
            if a.refused.get(key, 0.0):
                now = now or time.monotonic()
                if now < a.refused[key]:
                    continue
                del a.refused[key]
            r = next(self._route_ids)
            route = self._routes[r] = _Route(r, key, a, f.conn, f, secrets.token_hex(16))
            a.routes_out[key] = route
            f.conn.routes_in.add(route)
            f.routes.append(route)
            self._reply(a, {"id": 0, "op": "route", "key": key, "r": r, "token": route.token, "to": f.conn.direct})

    def _route_op(self, conn: _Conn, op: str, ctrl: dict, item: list) -> None:
        if op == "dreturn":
            return self._dreturn(conn, ctrl, item)
        route = self._routes.get(int(ctrl.get("r", 0)))
        if op == "start":
            ok = self._start(conn, route)
            return self._reply(conn, {"id": ctrl.get("id", 0), "value": ok is True, "later": ok is None})
        if route is None:
            return
        if op == "unrouted" and route.a is conn:
            self._copies(route, ctrl, item)
            self._unrouted(route, max(0, min(int(ctrl["last"]), ROUTE_ITEMS)))
        elif op == "route_done" and route.b is conn:
            route.got = max(0, min(int(ctrl["count"]), ROUTE_ITEMS))  # nothing more comes on its link
            if not route.a.alive and route.last is None:
                route.last = route.got  # the producer is gone: what the consumer read is all it sent
            self._maybe_close(route)

    def _start(self, conn: _Conn, route: Optional[_Route]) -> Optional[bool]:
        """Whether the producer may send on ``route`` from now on (every item before is fed already); None:
        not yet (items before wait in the queue, or a put there awaits its commit), the offer stands."""
        if route is None or route.a is not conn or route.started:
            return False
        q = self._queues.get(route.key)
        if route.live and q is not None and q.feed is route.feed and route.b.alive and (q.items or q.uncommitted):
            return None
        if not route.live or q is None or q.feed is not route.feed or q.items or q.uncommitted or not route.b.alive:
            conn.refused[route.key] = time.monotonic() + REFUSED_PAUSE
            route.live, route.last = False, 0
            if conn.routes_out.get(route.key) is route:
                del conn.routes_out[route.key]
            self._maybe_close(route)
            return False
        route.started = True
        route.seq0 = next(self._item_seq)
        q.routes += 1  # counted from now on: the key's gets wait for its items once the feed ends
        self._reply(route.b, {"id": 0, "op": "go", "key": route.key, "r": route.r, "token": route.token})
        return True

    def _unrouted(self, route: _Route, last: int) -> None:
        """The producer sent ``last`` items on ``route`` and no more.  If the feed goes on, it is recalled:
        the producer's later items come through the host and must not overtake the route's (which may still
        be on their way), so every item the consumer holds goes back to its place first."""
        q = self._queues.get(route.key)
        route.live, route.last = False, last
        if route.a.routes_out.get(route.key) is route:
            del route.a.routes_out[route.key]
        if route.started and route.b.alive:
            self._drain_acks(route.b, progress=False)  # what its consumer took already is resolved
        if not route.started or last == 0 or route.resolved < last:  # it never started, it failed, or its
            route.a.refused[route.key] = time.monotonic() + REFUSED_PAUSE  # consumer fell behind: not at once
        if route.resolved < last and q is not None and q.feed is route.feed and route.b.alive:
            self._recall(q, route.key)
        self._maybe_close(route)

    def _end_routes(self, f: _Feed) -> None:
        """``f`` ended: its producers stop sending on its routes (each says how many it sent)."""
        for route in list(f.routes):  # (a route that closes leaves the list)
            if route.live:
                route.live = False
                if route.a.alive:
                    self._reply(route.a, {"id": 0, "op": "unroute", "key": route.key, "r": route.r})
                if not route.started:
                    route.last = 0  # nothing can go on it: a start is refused from now on
                if route.a.routes_out.get(route.key) is route:
                    del route.a.routes_out[route.key]
            self._maybe_close(route)

    def _item_of(self, route: _Route, n: int, frames, weight: float) -> tuple:
        return (_own(frames, self._blocks), float(weight), route.seq0 + n)

    def _copies(self, route: _Route, ctrl: dict, item: list) -> None:
        """Copies of the items the producer sent on ``route`` that its consumer had not said it took
        (``n``, ``w``, ``sizes``): in flight until the consumer acknowledges or returns them, or back now if
        it is gone.  Checked whole before anything is applied."""
        ns, ws, sizes = ctrl.get("n", []), [float(w) for w in ctrl.get("w", [])], [int(s) for s in ctrl.get("sizes", [])]
        if not (len(ns) == len(ws) == len(sizes)) or sum(sizes) != len(item) or min(sizes, default=1) < 1:
            raise ValueError("copies whose sizes do not match their frames")
        last = int(ctrl.get("last", 0))
        if not all(0 < int(n) <= min(last, ROUTE_ITEMS) for n in ns) or (ns and not route.started):
            raise ValueError("copies of items the route did not carry")
        pos, back = 0, []
        q = self._queues.setdefault(route.key, _Queue())
        for n, w, size in zip(ns, ws, sizes):
            frames, pos, n = item[pos:pos + size], pos + size, int(n)
            if route.is_done(n) or n in route.copies:  # acknowledged or returned already
                continue
            if not route.b.alive:  # its consumer is gone: the item goes back
                back.append(self._item_of(route, n, frames, w))
                route.mark_done(n)
                route.resolved += 1
                continue
            route.copies[n] = self._item_of(route, n, frames, w)
            q.fed += 1
        if back:
            self._requeue(route.key, back)
            self._feed_later.add(route.key)

    def _acked_direct(self, conn: _Conn, i: int) -> Optional[str]:
        """The consumer handed out direct item ``i``; the key to serve, if any."""
        r, n = split_direct(i)
        route = self._routes.get(r)
        if route is None or route.b is not conn or route.is_done(n):
            return None
        copy = route.copies.pop(n, None)
        if copy is not None:
            self._blocks.give_back(copy[0])
            self._queues[route.key].fed -= 1
        route.mark_done(n)
        route.resolved += 1
        self._maybe_close(route)
        return route.key

    def _dreturn(self, conn: _Conn, ctrl: dict, item: list) -> None:
        """Direct items the consumer did not hand out, with their bytes: back to their places."""
        key = str(ctrl["key"])
        ids, ws, sizes = [int(i) for i in ctrl["ids"]], [float(w) for w in ctrl["w"]], [int(s) for s in ctrl["sizes"]]
        if not (len(ids) == len(ws) == len(sizes)) or sum(sizes) != len(item) or min(sizes, default=1) < 1:
            raise ValueError("returned items whose sizes do not match their frames")
        pos, back = 0, []
        for i, w, size in zip(ids, ws, sizes):
            frames, pos = item[pos:pos + size], pos + size
            r, n = split_direct(int(i))
            route = self._routes.get(r)
            if route is None or route.b is not conn:  # its route is closed (its producer is gone): at the tail
                back.append((_own(frames, self._blocks), w, next(self._item_seq)))
                continue
            key = route.key
            if route.is_done(n):
                continue
            copy = route.copies.pop(n, None)
            if copy is not None:
                self._queues[route.key].fed -= 1
                back.append(copy)
            else:
                back.append(self._item_of(route, n, frames, w))
            route.mark_done(n)
            route.resolved += 1
            self._maybe_close(route)
        if back:
            self._requeue(key, back)
        self._progress(key)

    def _routes_lost(self, conn: _Conn) -> set:
        """``conn`` went: its routes as producer end (the consumer's count closes them), those as
        consumer put their copies back.  The keys touched."""
        touched = set()
        for route in [r for r in self._routes.values() if r.a is conn]:  # (an ended feed's are no longer listed)
            route.live = False
            if not route.started:
                route.last = 0
            elif route.last is None and route.got is not None:
                route.last = route.got  # its link ended before: the consumer read all it sent
            self._maybe_close(route)
        conn.routes_out.clear()
        for route in list(conn.routes_in):
            if route.copies:
                q = self._queues.setdefault(route.key, _Queue())
                q.fed -= len(route.copies)
                self._requeue(route.key, list(route.copies.values()))
                route.resolved += len(route.copies)
                for n in route.copies:
                    route.mark_done(n)
                route.copies.clear()
                touched.add(route.key)
            if route.live and route.a.alive:
                self._reply(route.a, {"id": 0, "op": "unroute", "key": route.key, "r": route.r})
            route.live = False
            if not route.a.alive and route.last is None:
                route.last = route.resolved  # neither end is left to say more
            self._maybe_close(route)
        return touched

    def _maybe_close(self, route: _Route) -> None:
        """Forget ``route`` once every item sent on it is resolved (or nothing is left to resolve them)."""
        if route.r not in self._routes:
            return
        if route.got is not None and route.copies and max(route.copies) > route.got:
            q = self._queues.setdefault(route.key, _Queue())  # never came on the link (cut short): back now
            late = [n for n in route.copies if n > route.got]
            q.fed -= len(late)
            self._requeue(route.key, [route.copies.pop(n) for n in late])
            for n in late:
                route.mark_done(n)
            route.resolved += len(late)
            self._feed_later.add(route.key)
        # sent and read: the items the consumer has to account for (a producer cannot inflate it: its link ends)
        owed = route.last if route.last is None or route.got is None else min(route.last, route.got)
        if owed is None or route.resolved < owed and route.b.alive:
            return
        if route.copies and route.b.alive:
            return
        del self._routes[route.r]
        route.b.routes_in.discard(route)
        if route in route.feed.routes:
            route.feed.routes.remove(route)
        q = self._queues.get(route.key)
        if q is not None:
            q.routes -= route.started
            if route.copies:  # its consumer is gone: what it held goes back
                q.fed -= len(route.copies)
                self._requeue(route.key, list(route.copies.values()))
                route.copies.clear()
            self._feed_later.add(route.key)  # gets held for it go on
