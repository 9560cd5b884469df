"""Direct routes on the producer's side (a part of ``client.ChannelClient``; see ``routes``).

The host offers a route (``route``: the key, the consumer's endpoints and a
token) when this client pushes on a key fed to another.  A thread of its
own opens a link to the consumer at once; a later put on that key starts
the route (``start``, a request: the host grants it only if nothing waits
in the key's queue, every earlier item having gone to the consumer, and
otherwise answers *later*: the offer stands, and a put ``START_RETRY`` on
asks again, for ``START_WITHIN`` at most).  From then on every put there
that would be a push goes straight to the consumer instead, numbered on the
route, and returns once the link took it whole.  The producer keeps each
item until the consumer says it took it (a credit on the link, see
``direct_in``), so that an item a dead consumer held is not lost.

The producer ends a route (``unrouted``: the number of items it sent, with
copies of the ones the consumer has not said it took, which the host puts
back if the consumer is gone or returns, and drops once the consumer
acknowledges them) when the host asks (``unroute``), when no credit came
for ``ROUTE_STALL`` while ``ROUTE_WINDOW`` items were not credited, when
the link fails, or before a put on its key that cannot go straight (a
request: ``put_nowait``, a large item): before any later message, so such
a put goes through the host after it.
When ``ROUTE_WINDOW`` items are not credited yet, a put waits for the
consumer's next credit, ``ROUTE_STALL`` at most (flow control: a stream
whose producer outruns its consumer stays on the route), and only then
ends the route.  A synchronous put waits for the link to open (``DIAL_TIMEOUT`` at most),
an asynchronous one goes through the host until it is open, and starts the
route only when it is not part of a burst (see ``batching``: a start is a
round trip, and a burst's puts would be refused anyway, since the host
still queues the burst's earlier items).  While a route is started, or
after this client pushed, the heartbeat thread reads what came whenever no
one reads, so an offer reaches a producer that only pushes, and an
``unroute`` is answered within a tick (0.2 s) (the key's gets wait for it).  Reading all the
time instead (as for a reply) made the background reader hold the reader's
turn: every get then waited for a hand-over, and a ping-pong round went from
about 70 to 160 us, an asynchronous stream from 57,000 to 9,000 items/s.
"""

from __future__ import annotations

import atexit
import collections
import json
import select
import threading
import time
import weakref
from typing import Optional

from .direct_wire import read_credit, ready, send_item, shut
from .protocol import REPLY_GRACE, ROUTE_ITEMS, ROUTE_WINDOW, SendTimeout

#: seconds a direct put waits for its link to take the item (a consumer that does not read: the route ends)
DIRECT_SEND = 0.005
#: seconds a route's link may take to open
DIAL_TIMEOUT = 2.0
#: seconds after a start the host answered *later* (items wait in the queue) before the next try, and
#: after the offer before the producer gives the route up if it has not started (the consumer keeps a
#: link nobody started for ``direct_in.LINK_WAIT``, 10 s)
START_RETRY, START_WITHIN = 0.05, 5.0
#: seconds a put on a route whose window is full waits for the consumer's credit (then the route ends)
ROUTE_STALL = 0.02
#: bytes a producer keeps for a route (copies of items not credited yet): past them, as a full window
ROUTE_BYTES = 4 << 20
#: seconds a start waits for the puts of other threads already on their way to the host
START_WAIT = 0.05

_producers: "weakref.WeakSet" = weakref.WeakSet()  # clients offered a route: their routes end at exit


class _OutRoute:
    __slots__ = ("r", "key", "token", "to", "sock", "rest", "n", "credited", "kept", "kept_bytes", "started",
                 "starting", "ending", "ended", "lock", "dialed", "offered", "retry_at")

    def __init__(self, r: int, key: str, token: str, to: dict):
        self.r, self.key, self.token, self.to = r, key, token, to
        self.sock = None  # the link's socket, taken over (see ``direct_wire``)
        self.rest = b""  # the start of a credit cut by a read
        self.n = 0  # items sent on it
        self.credited = 0  # of those, taken by the consumer
        self.kept: collections.deque = collections.deque()  # (n, weight, frames, bytes) sent, not yet credited
        self.kept_bytes = 0
        self.dialed = threading.Event()  # the dial is over (``sock`` is set if it succeeded)
        self.offered = self.retry_at = time.monotonic()  # (no start before ``retry_at``)
        self.started = False
        self.starting = False  # a start is under way (set before it looks at the puts on their way to the host)
        self.ending = False  # to end before the next message (``unrouted``)
        self.ended = False
        self.lock = threading.RLock()  # one put on it at a time (which may end it: its start sends first)


class _DirectOut:
    """The producer side of routes (uses the client's sends, requests and failure handling)."""

    def _init_direct_out(self) -> None:
        self._out_routes: dict[str, _OutRoute] = {}
        self._ending = False  # a route is to end (see _OutRoute.ending): set before the route's own mark
        self._ending_lock = threading.Lock()
        #: key -> puts (of any thread) on their way to the host there: counted from before they look for a
        #: route until sent, so a start is sent after them (a thread's put must not follow its route's start)
        self._hosted: dict = {}
        self._hosted_lock = threading.Lock()
        self._pushed = False  # pushed since the last heartbeat tick (which then reads: a route may be offered)
        #: opens a link to a consumer's endpoints (set by ``connect``; None: this client takes no route)
        self._dial_direct = None

    def _route_offer(self, ctrl: dict) -> None:
        """The host's ``route`` or ``unroute`` (read by any reader)."""
        key = ctrl["key"]
        route = self._out_routes.get(key)
        if ctrl["op"] == "route":
            if (route is None or route.ending or route.ended) and self._dial_direct is not None \
                    and isinstance(ctrl.get("to"), dict):  # (an ended one may still be listed a moment)
                route = self._out_routes[key] = _OutRoute(int(ctrl["r"]), key, str(ctrl["token"]), ctrl["to"])
                _producers.add(self)
                threading.Thread(target=self._dial_route, args=(route,), name=f"rlinf-channel-{self.channel}-route",
                                 daemon=True).start()
            return
        if route is not None and route.r == int(ctrl["r"]):
            self._mark_ending(route)  # ended before the next message, or on a heartbeat tick

    def _dial_route(self, route: _OutRoute) -> None:
        """Open an offered route's link (a thread of its own: the reader that read the offer never waits)."""
        sock = link = None
        try:
            link = self._dial_direct(route.to, {"service": "channel-direct", "token": route.token}, DIAL_TIMEOUT)
            sock = link.detach()  # nothing was read on it: the route's own bytes
        except Exception:  # (the route ends below: its puts go through the host)
            pass
        finally:
            if sock is None and link is not None:
                try:
                    link.close()
                except Exception:
                    pass  # (whatever happened: a put waiting for the dial goes on)
            with route.lock:
                if sock is not None and not (route.ending or route.ended or self._dead is not None):
                    route.sock = sock
                elif sock is not None:
                    sock.close()
                route.dialed.set()
            if self._dead is not None and route.sock is not None:  # failed meanwhile (``fail`` takes no route lock)
                self._drop_route(route)
            if route.sock is None:
                self._mark_ending(route)  # (its ``unrouted`` goes with the next message or tick)

    def _mark_ending(self, route: _OutRoute) -> None:
        """``route`` ends before the next message (any thread's: ``_before_send`` looks at ``_ending``)."""
        with self._ending_lock:
            self._ending = True
            route.ending = True

    def put_direct(self, ctrl: dict, frames, limit: float, counted: list, may_start="wait") -> bool:
        """Send a put straight to the consumer on its key's route; False if it has none (or it just
        ended, or it is not started and ``may_start`` is False, or "open" and its link is not open yet):
        the put goes through the host.  Raises as a push does.  ``counted``: see ``hosted``."""
        key = ctrl["key"]
        route = self._out_routes.get(key)
        if route is None or route.ending:
            return False
        if not route.started and not route.starting:  # (read after the put was counted: see ``_start_route``)
            now = time.monotonic()
            if now - route.offered > START_WITHIN:
                self._mark_ending(route)  # (its link at the consumer would soon be closed there)
                return False
            if now < route.retry_at or (may_start == "open" and self._hosted.get(key, 0) > 1) or not (
                    may_start and (route.dialed.is_set() or may_start == "wait"
                                   and route.dialed.wait(min(limit, DIAL_TIMEOUT)))):
                return False  # (an asynchronous put waits neither for the link to open nor for other threads)
        self._count_hosted(key, -1, counted)  # not on its way to the host while it waits for the route
        if not route.lock.acquire(timeout=limit):  # (not through the host: it could overtake this thread's earlier items)
            raise SendTimeout(f"another put on the route held it for {limit:g} s", busy=True)
        try:
            if route.ending or route.ended or not route.started and (
                    time.monotonic() < route.retry_at or not self._start_route(route, limit) or route.ending):
                self._count_hosted(key, 1, counted)  # on its way to the host again, before a start can follow
                return False
            if (route.n - route.credited >= ROUTE_WINDOW or route.kept_bytes >= ROUTE_BYTES) \
                    and not self._await_credit(route, min(limit, ROUTE_STALL)) or route.n >= ROUTE_ITEMS:
                self._mark_ending(route)  # the consumer is behind: the host queues for it
                self._count_hosted(key, 1, counted)
                return False
            n = route.n + 1
            weight = ctrl["weight"]
            copy = [f if type(f) is bytes else bytes(f) for f in frames]  # (the caller may reuse its buffers)
            size = sum(len(f) for f in copy)
            route.n = n  # counted and kept first: an interrupt may land once it went (then it is delivered)
            route.kept.append((n, weight, copy, size))
            route.kept_bytes += size
            try:
                send_item(route.sock, n, weight, copy, time.monotonic() + DIRECT_SEND)
            except Exception:  # nothing of it, or a torn part the consumer drops, went: it goes through the host
                route.n = n - 1
                route.kept.pop()
                route.kept_bytes -= size
                self._mark_ending(route)
                self._count_hosted(key, 1, counted)
                return False
            except BaseException:  # interrupted: nothing more goes on the socket (n is never sent twice)
                self._mark_ending(route)
                shut(route.sock)
                raise
        finally:
            route.lock.release()
        return True

    def _start_route(self, route: _OutRoute, limit: float) -> bool:
        """Ask the host to start the route, whose link is open (under its lock).

        ``starting`` is set before it looks at the puts on their way to the host, and a put is counted
        before it looks at ``starting``: so either the start waits for the put to be sent, or the put
        sees the start under way and waits for its outcome (the route's lock)."""
        if route.sock is None:
            return False
        route.starting = True
        try:
            self._hosted_settled(route.key, limit)  # a put on its way to the host must not follow the start
            _rid, fut = self.request({"op": "start", "r": route.r}, (), limit, blocking=True)
            reply = self.wait_reply(fut, limit + REPLY_GRACE)[0]
            if reply.get("value") is True and not route.ended:
                route.started = True
                return True
            if reply.get("later") and not route.ended:  # items wait in the queue: the offer stands
                route.retry_at = time.monotonic() + START_RETRY
                return False
        except BaseException as exc:  # no answer: it ends with nothing sent on it (the host may have started it)
            self._mark_ending(route)
            if isinstance(exc, Exception):
                return False  # the put goes through the host (which raises if the host is gone)
            raise
        finally:
            route.starting = False
        route.ended = True  # refused (the host forgot it), or ended meanwhile (the host heard that)
        self._drop_route(route)
        return False

    def _read_credits(self, route: _OutRoute) -> None:
        if route.rest is None:  # an interrupt cut a read: the credits that follow cannot be trusted
            return
        try:
            credit, rest = read_credit(route.sock, route.rest)
        except ValueError:  # out of step (an interrupt dropped bytes read from it): the route keeps all it
            route.rest = None  # has, and ends
            self._mark_ending(route)
            return
        except BaseException:  # (bytes read may be lost: the next read finds the stream out of step)
            self._mark_ending(route)
            raise
        route.rest = rest
        if credit is not None:
            route.credited = max(route.credited, min(credit, route.n))
            while route.kept and route.kept[0][0] <= route.credited:  # taken: nothing of it is at risk now
                route.kept_bytes -= route.kept.popleft()[3]

    def _await_credit(self, route: _OutRoute, seconds: float) -> bool:
        """Wait for credits until the window has room again; False if none came within ``seconds``."""
        self._read_credits(route)  # the credits that came meanwhile (read only when the window is full)
        deadline = time.monotonic() + seconds
        while route.n - route.credited >= ROUTE_WINDOW or route.kept_bytes >= ROUTE_BYTES:
            left = deadline - time.monotonic()
            if left <= 0 or not ready(route.sock, select.POLLIN, left):
                return False
            before = (route.credited, route.rest)
            self._read_credits(route)
            if (route.credited, route.rest) == before:  # readable, and nothing came: the link ended
                return False
        return True

    def _drop_route(self, route: _OutRoute) -> None:
        if self._out_routes.get(route.key) is route:
            del self._out_routes[route.key]
        if route.sock is not None:
            try:
                route.sock.close()  # the consumer reads what was sent, then the end
            except OSError:
                pass

    def _end_routes_out(self, limit: Optional[float] = None, when_idle: bool = False) -> bool:
        """End the routes that are ending (``unrouted``, with the copies); False if one could not go now."""
        if not self._ending:
            return True
        for route in [r for r in list(self._out_routes.values()) if r.ending and not r.ended]:
            # a heartbeat tick never waits; nor does anyone for a route that carried nothing (its end may go
            # later: no item can overtake it), whose lock a thread starting it may hold
            quick = when_idle or not route.n
            if not (route.lock.acquire(False) if quick else
                    route.lock.acquire(timeout=self._send_timeout if limit is None else limit)):
                if quick:
                    continue
                return False
            try:
                if route.ended:
                    continue
                if route.sock is not None:
                    self._read_credits(route)
                kept = list(route.kept)
                ctrl = {"id": 0, "op": "unrouted", "r": route.r, "last": route.n, "n": [k[0] for k in kept],
                        "w": [k[1] for k in kept], "sizes": [len(k[2]) for k in kept]}
                if not self._send_one_way(ctrl, limit, when_idle, [f for k in kept for f in k[2]]):
                    return False
                route.ended = True
                self._drop_route(route)
            finally:
                route.lock.release()
        with self._ending_lock:  # a route marked meanwhile set it again after its own mark: it stays set
            self._ending = any(r.ending and not r.ended for r in self._out_routes.values())
        return True

    def hosted(self, key: str, direct, counted: list) -> bool:
        """Count a put on ``key`` as on its way to the host, and put it through ``direct()`` if ``key``
        has a route; True if it went straight.  ``direct`` takes the count off only while it waits for the
        route's lock or went straight, and counts a put it returns False for again before it releases that
        lock.  ``counted`` (``[0]``, the caller's) holds this put's count: the caller's ``hosted_done``, in
        a ``finally``, takes off whatever is left, however the put ended."""
        self._count_hosted(key, 1, counted)
        return key in self._out_routes and direct()

    def _count_hosted(self, key: str, n: int, counted: list) -> None:
        with self._hosted_lock:
            left = self._hosted.get(key, 0) + n
            counted[0] += n
            if left:
                self._hosted[key] = left
            else:
                self._hosted.pop(key, None)

    def _end_route_of(self, key: str) -> bool:
        route = self._out_routes.get(key)
        if route is not None:
            self._mark_ending(route)
        return False

    def hosted_done(self, key: str, counted: list) -> None:
        if counted[0]:
            self._count_hosted(key, -counted[0], counted)

    def _hosted_settled(self, key: str, limit: float) -> None:
        """Wait (``START_WAIT`` at most) until no put of another thread is on its way to the host on ``key``."""
        end = time.monotonic() + min(limit, START_WAIT)
        while self._hosted.get(key):
            if time.monotonic() > end:
                raise SendTimeout("other threads kept putting through the host")
            time.sleep(0.0002)

    def end_routes(self, grace: float) -> None:
        """End every route (before the connection closes): what the consumer has not taken is copied to the
        host, which puts it back if the consumer goes."""
        for route in list(self._out_routes.values()):
            self._mark_ending(route)
        try:
            self._end_routes_out(grace)
        except Exception:
            pass

    def _tend_routes(self) -> None:
        """Heartbeat tick: while a route is started, or after pushes, read what came if no one reads (an
        offer reaches a producer that only pushes; an ``unroute`` is answered within a tick, not at the next
        ping: the key's gets wait for it), and end the routes told to."""
        pushed, self._pushed = self._pushed, False
        if pushed or any(r.started and not r.ended for r in list(self._out_routes.values())):
            self._read_arrived()
        now = time.monotonic()
        for route in list(self._out_routes.values()):
            if not (route.started or route.starting or route.ending) and now - route.offered > START_WITHIN:
                self._mark_ending(route)  # never started: its link is closed, and the host forgets it
        if self._ending:
            self._end_routes_out(when_idle=True)

    def _close_routes_out(self) -> None:
        for route in list(self._out_routes.values()):
            self._drop_route(route)


@atexit.register
def _end_routes_at_exit() -> None:
    """Routes end as the interpreter ends (5 s at most), so their consumers' later deaths lose nothing."""
    for client in list(_producers):
        if client._dead is None and client._out_routes:
            client.end_routes(5.0)


def dialer(transport, dial):
    """A ``_dial_direct`` for clients whose transport is ``transport`` (``dial(transport, endpoint, hello,
    deadline)`` opens an authenticated link)."""

    def dial_direct(endpoints: dict, hello: dict, timeout: float):
        endpoint = endpoints.get(transport[0]) or endpoints.get("cpu")
        if endpoint is None:
            raise ConnectionError("the consumer offers no transport this process can use")
        return dial(transport[1], endpoint, json.dumps(hello).encode(), time.monotonic() + timeout)

    return dial_direct
