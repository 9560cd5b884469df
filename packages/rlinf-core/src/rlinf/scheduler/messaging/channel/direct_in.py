"""Direct routes on the consumer's side (a part of ``client.ChannelClient``; see ``routes``).

A consumer fed on a key offers where producers may reach it (``direct`` in
its get: its worker's endpoints).  When the host says ``go`` for a route,
the link its producer opened (its hello names the route's token, which only
the host, the producer and this process know) joins this connection: whoever
reads the connection reads the route's socket too, waiting on all of them at
once, so a get parked here takes a direct item without any thread hand-over.
Direct items join the key's feed buffer as fed items do; each is
acknowledged with its own id (``direct_id``), and given back with its bytes
(``dreturn``) if the user does not take it.  Every ``CREDIT_EVERY`` items
acknowledged (the first ones of the route, in order), this process says so
on the route's socket; its producer keeps each item until then, and may
have at most ``ROUTE_WINDOW`` not credited.
"""

from __future__ import annotations

import select
import threading
import time
from typing import Callable, Optional

from ...base import config
from .direct_wire import Reader, pack_credit
from .protocol import ROUTE_WINDOW, direct_id, split_direct

#: items taken between two credits on a route's link
CREDIT_EVERY = 16
#: seconds a route's link waits for the host's ``go`` before it is closed, and the most that wait
LINK_WAIT, LINKS_WAITING = 10.0, 256
#: microseconds a get with routes polls before it sleeps (the next item of a route often comes within it,
#: and a sleeping consumer costs every item a wake-up: a ping-pong round went from 160-250 to 70-90 us)
SPIN_ENV, DEFAULT_SPIN_US = "RLINF_CHANNEL_GET_SPIN_US", 200.0
_LINK_SPIN = 50e-6  # otherwise as a link's receive spins (``RLINF_SPIN_US``)

_lock = threading.Lock()
_expected: dict = {}  # token -> (client, route, when) told "go", whose link has not come yet
_arrived: dict = {}  # token -> (the link's socket, when) come before the "go"
_endpoints: Optional[dict] = None
_endpoints_for: Optional[Callable[[], Optional[dict]]] = None  # set below: a worker's own
_endpoints_of = None  # the communicator they are of (a worker's next communicator has others)


def on_direct(link, info: dict) -> None:
    """A producer's link for a route (from the transport's handshake thread, already authenticated)."""
    token = info.get("token")
    sock = link.detach() if isinstance(token, str) else None  # nothing read past the hello: the route's own bytes
    if sock is None:
        link.close()
        return
    with _lock:
        prune()
        waiting = _expected.pop(token, None)
        if waiting is None:
            if len(_arrived) >= LINKS_WAITING:  # nobody expects so many: the newest goes
                sock.close()
                return
            _arrived[token] = (sock, time.monotonic())
            return
    client, route, _when = waiting
    client._attach_route(route, sock)


def prune() -> None:
    """Close the links no ``go`` named within ``LINK_WAIT`` (a refused start leaves its link here), and
    forget the ``go`` whose link did not come in that time, telling the host that nothing came on that
    route (the link was closed here, or never opened: the copies its producer sent back go back to the
    queue) (under ``_lock``)."""
    now = time.monotonic()
    for old in [t for t, (_s, when) in _arrived.items() if now - when > LINK_WAIT]:
        _arrived.pop(old)[0].close()
    for old in [t for t, (_c, _r, when) in _expected.items() if now - when > LINK_WAIT]:
        client, route, _when = _expected.pop(old)  # nothing came on it: the host puts back what it holds for it
        client._returns.append(({"id": 0, "op": "route_done", "r": route.r, "count": 0}, ()))


def serve_direct(endpoints: Optional[dict]) -> None:
    """Take direct routes at ``endpoints`` (whose listener hands their links to ``on_direct``), or, with
    None, at this worker's own (none outside workers)."""
    global _endpoints, _endpoints_for
    _endpoints, _endpoints_for = endpoints, (None if endpoints is not None else _worker_endpoints)


def _worker_endpoints() -> Optional[dict]:
    """A worker's own endpoints, where its communicator takes route links (none outside workers)."""
    global _endpoints_of, _worker_cached
    from ..p2p.communicator import local_communicator

    comm = local_communicator()
    if comm is None or comm is not _endpoints_of:
        try:
            comm = local_communicator(create=True)
        except Exception:
            return None
        if comm is None:
            return None
        comm.add_service("channel-direct", on_direct)
        _endpoints_of, _worker_cached = comm, comm.endpoints() or None
    return _worker_cached


_worker_cached: Optional[dict] = None
_endpoints_for = _worker_endpoints


def direct_endpoints() -> Optional[dict]:
    """Where producers may reach this process's routes: given (``serve_direct``), or its worker's."""
    return _endpoints if _endpoints_for is None else _endpoints_for()


class _InRoute:
    __slots__ = ("r", "key", "token", "sock", "reader", "feed", "count", "taken", "taken_out", "credited", "fd")

    def __init__(self, r: int, key: str, token: str, feed):
        self.r, self.key, self.token, self.feed = r, key, token, feed
        self.sock = None  # the link's socket, taken over (see ``direct_wire``)
        self.reader: Optional[Reader] = None
        self.fd: Optional[int] = None
        self.count = 0  # items read on it
        self.taken = 0  # items 1..taken were acknowledged (and those in taken_out: two threads may take)
        self.taken_out: set = set()
        self.credited = 0


class _DirectIn:
    """The consumer side of routes (uses the client's feeds, reader turn, returns and acks)."""

    def _init_direct_in(self) -> None:
        self._in_routes: dict[int, _InRoute] = {}  # r -> a route whose link is here
        self._in_poll = None  # select.poll over the connection and the routes' links, as of _in_gen
        self._in_gen = 0  # bumped when a route comes or goes (attached from the transport's thread too)
        self._poll_gen = -1
        self._direct_weights: dict = {}  # direct item id -> its weight (for a return)
        self._get_spin = max(0.0, config._finite_env(SPIN_ENV, DEFAULT_SPIN_US)) / 1e6
        #: the key a get reading now waits on (its thread is the reader): it spins long only for a route's
        #: item (through the host, a third process needs the core: a 200 us spin cut a stream by a quarter)
        self._waiting_key: Optional[str] = None

    def _direct_offer(self) -> Optional[dict]:
        return direct_endpoints() if self._bursts else None

    def _route_go(self, ctrl: dict) -> None:
        """The host's ``go`` for a route to this process (read with the connection's lock on feeds)."""
        route = _InRoute(int(ctrl["r"]), ctrl["key"], str(ctrl["token"]), self._feeds.get(ctrl["key"]))
        with _lock:
            prune()
            arrived = _arrived.pop(route.token, None)
            if arrived is None:
                _expected[route.token] = (self, route, time.monotonic())
                return
        self._attach_route(route, arrived[0])

    def _attach_route(self, route: _InRoute, sock) -> None:
        if self._dead is not None:
            sock.close()
            return
        route.sock, route.reader, route.fd = sock, Reader(sock), sock.fileno()
        self._in_routes[route.r] = route
        self._in_gen += 1

    def _links_poll(self):
        gen = self._in_gen
        if gen != self._poll_gen:  # (a route attached while this builds bumps it again: built anew next time)
            poll = select.poll()
            poll.register(self._link.poll_fd(), select.POLLIN)
            for route in list(self._in_routes.values()):
                poll.register(route.fd, select.POLLIN)
            self._in_poll, self._poll_gen = poll, gen
        return self._in_poll

    def _wait_links(self, deadline: float):
        """The next message on the connection, reading the routes' links meanwhile (reader only): None if
        direct items came first; ``TimeoutError`` if nothing came by ``deadline``."""
        msg = self._link.recv_nowait()
        if msg is not None:
            return msg
        host = self._link.poll_fd()
        key = self._waiting_key
        spin = self._get_spin if any(r.key == key for r in list(self._in_routes.values())) else _LINK_SPIN
        spin_end = time.perf_counter() + spin
        while True:
            poll = self._links_poll()
            if time.perf_counter() < spin_end:
                ready = poll.poll(0)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("nothing came")
                ready = poll.poll(max(1, int(min(left, 1.0) * 1000)))
            if not ready:
                continue
            if any(fd != host for fd, _ in ready) and self._read_direct():
                return None
            if any(fd == host for fd, _ in ready):
                msg = self._link.recv_nowait()
                if msg is not None:
                    return msg

    def _read_direct(self) -> int:
        """Read what came on the routes' links (reader only): items into their feeds, or back to the host."""
        got = 0
        for route in list(self._in_routes.values()):
            items, ended = route.reader.read(ROUTE_WINDOW)
            for n, weight, frames in items:
                if n != route.count + 1:  # not the route's next item: its link is broken
                    ended = True
                    break
                route.count = n
                self._direct_item(route, direct_id(route.r, n), weight, frames)
                got += 1
            if ended:
                self._route_gone(route)
        return got

    def _direct_item(self, route: _InRoute, rid: int, weight: float, frames) -> None:
        self._direct_weights[rid] = weight
        with self._fed_cond:
            feed = self._feeds.get(route.key)
            if feed is None or feed is not route.feed:  # its feed ended: it goes back (with its bytes)
                self._queue_return(route.key, [(rid, frames)], False)
                return
            feed.buffer.append((rid, frames))
            if self._fed_waiting:
                self._fed_cond.notify_all()

    def _route_gone(self, route: _InRoute) -> None:
        """A route's link ended: tell the host how many items came on it (if its producer went, that closes it)."""
        self._in_routes.pop(route.r, None)
        self._in_gen += 1
        route.sock.close()
        self._returns.append(({"id": 0, "op": "route_done", "r": route.r, "count": route.count}, ()))

    def _credit(self, rid: int) -> None:
        """Direct item ``rid`` was acknowledged to the host: tell its producer, now and then, how many of
        the route's first items were (it keeps them until then)."""
        r, n = split_direct(rid)
        route = self._in_routes.get(r)
        if route is None:
            return
        with self._fed_cond:  # threads that took items of one route acknowledge them in any order
            if n != route.taken + 1:
                if n > route.taken:
                    route.taken_out.add(n)
                return
            route.taken = n
            while route.taken + 1 in route.taken_out:
                route.taken += 1
                route.taken_out.discard(route.taken)
            if route.taken - route.credited >= CREDIT_EVERY:
                route.credited = route.taken
                try:
                    route.sock.send(pack_credit(route.taken))
                except OSError:
                    pass  # its producer is gone, or does not read: the route ends from its side

    @staticmethod
    def _prune_links() -> None:
        """Heartbeat tick: close the links no ``go`` named in time, and give up the ``go`` no link followed."""
        if _arrived or _expected:
            with _lock:
                prune()

    def _took_direct(self, rid: int) -> None:
        self._direct_weights.pop(rid, None)
        self._credit(rid)

    def _close_routes_in(self) -> None:
        for route in list(self._in_routes.values()):
            route.sock.close()
        self._in_routes.clear()
        with _lock:
            for token in [t for t, (c, _r, _w) in _expected.items() if c is self]:
                del _expected[token]
