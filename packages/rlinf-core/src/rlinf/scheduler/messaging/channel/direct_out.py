"""Direct routes on the producer's side (a part of ``client.ChannelClient``; see ``routes``).

The host offers a route (``route``: the key, the consumer's endpoints and a
token).  The next put on that key opens a link to the consumer and starts
the route (``start``, a request: the host grants it only if every earlier
item of the key has gone to the consumer).  From then on every put there
that would be a push goes straight to the consumer instead, numbered on the
route, and returns once the link took it whole; a *copy* of it is queued for
the host (``copies``), which keeps it in flight until the consumer has it.
Copies go before any later message on the connection, in batches
(``COPIES_ITEMS`` or ``COPIES_BYTES``), and on each heartbeat tick.

The producer ends a route (``unrouted``, with the number of items it sent;
after the copies, before any later put) when the host asks (``unroute``),
when the consumer has not taken ``ROUTE_WINDOW`` of its items, or when the
link fails; the put that found it so goes through the host, after that message.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from typing import Optional

from .protocol import CREDIT, DIRECT_HEAD, REPLY_GRACE, ROUTE_ITEMS, ROUTE_WINDOW, SendTimeout

#: copies queued before they are sent with the put that makes them
COPIES_ITEMS, COPIES_BYTES = 64, 256 << 10
#: seconds a direct put waits for its link to take the item (a consumer that does not read: the route ends)
DIRECT_SEND = 0.005
#: seconds a route's link may take to open
DIAL_TIMEOUT = 2.0


class _OutRoute:
    __slots__ = ("r", "key", "token", "to", "link", "n", "credited", "started", "ending", "ended", "lock")

    def __init__(self, r: int, key: str, token: str, to: dict):
        self.r, self.key, self.token, self.to = r, key, token, to
        self.link = None
        self.n = 0  # items sent on it
        self.credited = 0  # of those, taken by the consumer
        self.started = False
        self.ending = False  # to end before the next message (``unrouted``)
        self.ended = False
        self.lock = threading.RLock()  # one put on it at a time (which may end it: its start sends first)


class _DirectOut:
    """The producer side of routes (uses the client's sends, requests and failure handling)."""

    def _init_direct_out(self) -> None:
        self._out_routes: dict[str, _OutRoute] = {}
        self._copies: list = []  # (r, n, weight, frames), in the order sent
        self._copies_bytes = 0
        self._copies_lock = threading.Lock()  # held across taking the copies, sending them and keeping them
        self._ending = False  # a route is to end (see _OutRoute.ending)
        #: opens a link to a consumer's endpoints (set by ``connect``; None: this client takes no route)
        self._dial_direct = None

    def _route_offer(self, ctrl: dict) -> None:
        """The host's ``route`` or ``unroute`` (read by any reader)."""
        key = ctrl["key"]
        route = self._out_routes.get(key)
        if ctrl["op"] == "route":
            if route is None and self._dial_direct is not None and isinstance(ctrl.get("to"), dict):
                self._out_routes[key] = _OutRoute(int(ctrl["r"]), key, str(ctrl["token"]), ctrl["to"])
            return
        if route is not None and route.r == int(ctrl["r"]):
            route.ending = self._ending = True  # ended before the next message, or on a heartbeat tick

    def put_direct(self, ctrl: dict, frames, nbytes: int, limit: float) -> bool:
        """Send a put straight to the consumer on its key's route; False if it has none (or it just
        ended): the put goes through the host.  Raises as a push does."""
        route = self._out_routes.get(ctrl["key"])
        if route is None or route.ending:
            return False
        if not route.lock.acquire(timeout=limit):
            return False
        try:
            if route.ending or route.ended:
                return False
            if not route.started and not self._start_route(route, limit):
                return False
            if route.n - route.credited >= ROUTE_WINDOW // 2:
                self._read_credits(route)
            if route.n - route.credited >= ROUTE_WINDOW or route.n >= ROUTE_ITEMS:
                route.ending = self._ending = True  # the consumer is behind: the host queues for it
                return False
            n = route.n + 1
            weight = ctrl["weight"]
            try:
                route.link.send([DIRECT_HEAD.pack(n, weight), *frames], time.monotonic() + DIRECT_SEND)
            except Exception:  # nothing of it, or a torn part the consumer drops, went: it goes through the host
                route.ending = self._ending = True
                return False
            route.n = n
            with self._copies_lock:
                self._copies.append((route.r, n, weight, frames))
                self._copies_bytes += nbytes
                full = len(self._copies) >= COPIES_ITEMS or self._copies_bytes >= COPIES_BYTES
        finally:
            route.lock.release()
        if full:
            self._send_copies(when_idle=True)  # else before the next message, or on a tick
        return True

    def _start_route(self, route: _OutRoute, limit: float) -> bool:
        """Open the route's link and ask the host to start it (under its lock)."""
        try:
            route.link = self._dial_direct(route.to, {"service": "channel-direct", "token": route.token},
                                           min(limit, DIAL_TIMEOUT))
        except Exception:
            route.ending = self._ending = True
            return False
        try:
            _rid, fut = self.request({"op": "start", "r": route.r}, (), limit, blocking=True)
            reply = self.wait_reply(fut, limit + REPLY_GRACE)
        except SendTimeout:
            route.ending = self._ending = True  # the host never heard of the start: it ends with nothing sent
            return False
        if reply[0].get("value") is not True or route.ended:  # refused (the host forgot it), or ended meanwhile
            route.ended = True
            self._drop_route(route)
            return False
        route.started = True
        return True

    def _read_credits(self, route: _OutRoute) -> None:
        while True:
            try:
                msg = route.link.recv_nowait()
            except Exception:
                return
            if msg is None:
                return
            try:
                route.credited = max(route.credited, min(CREDIT.unpack(msg[1][0])[0], route.n))
            except (struct.error, IndexError):
                return

    def _drop_route(self, route: _OutRoute) -> None:
        if self._out_routes.get(route.key) is route:
            del self._out_routes[route.key]
        if route.link is not None:
            try:
                route.link.close()  # the consumer reads what was sent, then the end
            except Exception:
                pass

    def _send_copies(self, limit: Optional[float] = None, when_idle: bool = False) -> bool:
        """Send the queued copies; False if they are still queued (the connection was held)."""
        lock = self._copies_lock
        if not (lock.acquire(False) if when_idle else lock.acquire(timeout=self._send_timeout if limit is None else limit)):
            return False
        try:
            if not self._copies:
                return True
            copies = self._copies
            ctrl = {"id": 0, "op": "copies", "r": [c[0] for c in copies], "n": [c[1] for c in copies],
                    "w": [c[2] for c in copies], "sizes": [len(c[3]) for c in copies]}
            if not self._send_one_way(ctrl, limit, when_idle, [f for c in copies for f in c[3]]):
                return False
            self._copies, self._copies_bytes = [], 0
            return True
        finally:
            lock.release()

    def _end_routes_out(self, limit: Optional[float] = None, when_idle: bool = False) -> bool:
        """Send the copies, then end the routes that are ending; False if something is still to send."""
        if not self._send_copies(limit, when_idle):
            return False
        if not self._ending:
            return True
        self._ending = False
        for route in [r for r in list(self._out_routes.values()) if r.ending and not r.ended]:
            if not route.lock.acquire(timeout=self._send_timeout if limit is None else limit):
                self._ending = True
                return False
            try:
                if route.ended:
                    continue
                if not self._send_copies(limit, when_idle) or not self._send_one_way(
                        {"id": 0, "op": "unrouted", "r": route.r, "last": route.n}, limit, when_idle):
                    self._ending = True
                    return False
                route.ended = True
                self._drop_route(route)
            finally:
                route.lock.release()
        return True

    def _close_routes_out(self) -> None:
        for route in list(self._out_routes.values()):
            self._drop_route(route)


def dialer(transport, dial):
    """A ``_dial_direct`` for clients whose transport is ``transport`` (``dial(transport, endpoint, hello,
    deadline)`` opens an authenticated link)."""

    def dial_direct(endpoints: dict, hello: dict, timeout: float):
        endpoint = endpoints.get(transport[0]) or endpoints.get("cpu")
        if endpoint is None:
            raise ConnectionError("the consumer offers no transport this process can use")
        return dial(transport[1], endpoint, json.dumps(hello).encode(), time.monotonic() + timeout)

    return dial_direct
