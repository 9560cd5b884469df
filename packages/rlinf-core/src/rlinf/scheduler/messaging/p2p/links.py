"""Links to peers: one per direction per pair, made on first use, swept and closed when idle.

An outgoing link is made by the first send to a peer (``_outgoing``); an
incoming one arrives with its hello (``_on_accept``), which names the sender,
or names a service (broadcasts, channels) that takes the connection instead.
A newer connection from the same sender is queued behind the current one and
read after it ends (``_promote``, ``_retire``), so nothing a sender sent is lost
or reordered.  Links of peers that went away are closed (``_sweep``) the next
time a connection is made, and by one housekeeping thread per process, which
starts with the process's first link, incoming or outgoing, and sweeps every
``SWEEP_INTERVAL`` seconds: a worker that only receives lets go of a dead
sender's link, and of the shared memory its receiver keeps mapped for reuse,
within that interval.  The same thread closes outgoing links idle for
``RLINF_IDLE_LINK_TIMEOUT`` seconds, in the pair's turn.

``LinksMixin`` is one part of ``Communicator`` (communicator.py), which holds
the state it uses.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from ...base.address import WorkerAddress
from ...base.errors import CommunicationError
from ...plugins.transport import Link, Transport
from ...transports.ordering import SerialRunner, Turnstile

log = logging.getLogger("rlinf.p2p")

#: seconds between two sweeps of a process's links for peers that went away (at most)
SWEEP_INTERVAL = 1.0


@dataclass
class _Pair:
    """One direction of one pair: the connection and its ordering."""

    peer: str
    turnstile: Turnstile = field(default_factory=Turnstile)
    runner: Optional[SerialRunner] = None
    link: Optional[Link] = None
    transport: Optional[str] = None
    endpoint: Optional[dict] = None  # what an outgoing link connected to
    last_used: float = 0.0  # outgoing only: when a send last took the link (time.monotonic)
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: incoming only: newer connections from the same sender, read once ``link`` has ended
    queued: collections.deque = field(default_factory=collections.deque)

    def serial(self) -> SerialRunner:
        with self.lock:
            if self.runner is None:
                self.runner = SerialRunner(f"rlinf-p2p-{self.peer}")
            return self.runner


class LinksMixin:
    """The pair tables, connections in and out, services, sweeping and idle closing, for ``Communicator``."""

    name: str
    stats: dict
    _cond: threading.Condition
    _out: dict[str, _Pair]
    _in: dict[str, _Pair]
    _groups: dict
    _transports: dict[str, Transport]
    _services: dict[str, Callable]
    _idle_timeout: float
    _housekeeper: Optional[threading.Thread]
    _closed: threading.Event

    def _pair(self, table: dict, peer: str) -> _Pair:
        pair = table.get(peer)
        if pair is not None:
            return pair
        with self._cond:
            pair = table.get(peer)
            if pair is None:
                pair = table[peer] = _Pair(peer)
            return pair

    # -- connections -------------------------------------------------------------
    def add_service(self, kind: str, on_connect: Callable[[Link, dict], None]) -> None:
        """Route connections whose hello has ``"service": kind`` to ``on_connect`` (channels use this)."""
        self._services[kind] = on_connect

    def _on_accept(self, link: Link, hello: bytes) -> None:
        try:
            info = json.loads(hello)
            service = info.get("service")
            if service is not None:
                self._services[service](link, info)
                return
            src, transport = info["src"], info["transport"]
        except (ValueError, KeyError, TypeError):
            link.close()
            return
        pair = self._pair(self._in, src)
        with self._cond:
            if pair.link is None:
                pair.link, pair.transport = link, transport
            else:  # the current link may still hold messages: this one is read after it
                pair.queued.append((link, transport))
            self._cond.notify_all()
        self._sweep()
        self._start_housekeeping()  # a worker that only receives sweeps too: a dead sender's segments go

    def _sweep(self) -> None:
        """Close the links of peers that went away (called whenever a connection is made)."""
        closed = []
        with self._cond:
            for pair in list(self._in.values()):
                for entry in list(pair.queued):
                    if entry[0].peer_closed():
                        pair.queued.remove(entry)
                        closed.append(entry[0])
                if pair.link is not None and pair.link.peer_closed():
                    closed.append(pair.link)
                    self._promote(pair)
            for pair in list(self._out.values()):
                if pair.link is not None and pair.link.peer_closed():
                    closed.append(pair.link)
                    pair.link = None
        for link in closed:
            link.close()

    # -- idle links ------------------------------------------------------------------
    def _start_housekeeping(self) -> None:
        if self._housekeeper is not None:
            return
        with self._cond:
            if self._housekeeper is None and not self._closed.is_set():
                self._housekeeper = threading.Thread(target=self._housekeep, name="rlinf-p2p-housekeeping",
                                                     daemon=True)
                self._housekeeper.start()

    def _housekeep(self) -> None:
        """Close ended links (``SWEEP_INTERVAL``), idle outgoing ones, and unmap broadcast segments kept
        from sources gone quiet (a few times per idle timeout)."""
        interval = min(SWEEP_INTERVAL, max(0.05, self._idle_timeout / 4))
        while not self._closed.wait(interval):  # bounded: wakes every interval; close() ends it at once
            try:
                self.close_idle_links()
                self._sweep()
                state = getattr(self, "broadcast_state", None)
                if state is not None:
                    state.drop_idle(self._idle_timeout)
            except Exception:  # never let housekeeping end: the next round tries again
                log.debug("%s: housekeeping failed", self.name, exc_info=True)

    def close_idle_links(self, idle: Optional[float] = None) -> int:
        """Close outgoing links unused for ``idle`` seconds (default ``RLINF_IDLE_LINK_TIMEOUT``); returns how many.

        Each close takes the pair's turn without waiting (a pair with an
        operation running or queued is not idle), so it never cuts a send
        short and the next send, which reconnects, comes after it.
        """
        idle = self._idle_timeout if idle is None else idle
        now = time.monotonic()
        with self._cond:
            candidates = [p for p in self._out.values() if p.link is not None and now - p.last_used >= idle]
        closed = 0
        for pair in candidates:
            ticket = pair.turnstile.try_take()
            if ticket is None:
                continue
            try:
                with self._cond:
                    link = pair.link
                    if link is None or time.monotonic() - pair.last_used < idle:
                        continue
                    pair.link = None
                link.close()
                closed += 1
            finally:
                pair.turnstile.done(ticket)
        self.stats["idle_closed"] += closed
        return closed

    # -- incoming links in order -------------------------------------------------------
    def _promote(self, pair: _Pair) -> None:
        """The current incoming link has ended: the next queued one takes its place (lock held)."""
        pair.link, pair.transport = pair.queued.popleft() if pair.queued else (None, pair.transport)

    def _retire(self, pair: _Pair, link: Link) -> None:
        """``link`` delivered everything it will: close it and move on to the next one."""
        with self._cond:
            if pair.link is link:
                self._promote(pair)
        link.close()

    # -- outgoing links ----------------------------------------------------------------
    def _outgoing(self, peer: WorkerAddress, transport: str, deadline: Optional[float]) -> tuple[_Pair, Link]:
        """The pair and the link to send to ``peer`` on, connecting on first use.

        Called in the pair's turn (one sender at a time); the sweep may still
        close a link whose peer left, so callers use the link returned here.
        """
        pair = self._pair(self._out, peer.get_name())
        link = pair.link
        if link is not None and not link.is_open():
            # the peer went away: forget the link and the peer's record, so that a
            # group relaunched under the same name is found and connected afresh
            link.close()
            link = pair.link = None
            self._groups.pop(peer.group_key, None)
        if link is not None and pair.transport == transport:
            pair.last_used = time.monotonic()
            return pair, link
        if link is not None:
            raise CommunicationError(
                f"{self.name}: already sending to {peer.get_name()!r} with transport {pair.transport!r}; "
                f"both ends of a pair must use one transport (asked for {transport!r})",
                peer=peer.get_name(),
            )
        record = self._lookup(peer)
        endpoint = record.endpoints.get(transport)
        if endpoint is None:
            record = self._lookup(peer, refresh=True)
            endpoint = record.endpoints.get(transport)
        if endpoint is None:
            raise CommunicationError(
                f"{self.name}: {self._describe(peer)} does not offer transport {transport!r} "
                f"(it offers {sorted(record.endpoints)})",
                peer=peer.get_name(),
            )
        hello = json.dumps({"src": self.name, "transport": transport}).encode()
        pair.endpoint = endpoint  # also when connecting fails: the sender compares it with a fresh record
        link = self._connect(self._transports[transport], endpoint, hello, deadline)
        pair.link, pair.transport = link, transport
        pair.last_used = time.monotonic()
        self._sweep()
        self._start_housekeeping()
        return pair, link

    @staticmethod
    def _connect(transport: Transport, endpoint: dict, hello: bytes, deadline: Optional[float],
                 again_after_hello: bool = True) -> Link:
        """``transport.connect``, again while the deadline allows if the listener did not take the connection.

        A burst of connections on a loaded machine (an all-to-all among 64
        workers on 2 cores) can keep a listener's handshake threads from taking
        a connection within the handshake timeout; the listener drops it.  It
        carried nothing, and one that was taken late is read to its (empty)
        end before the next, so connecting again loses and reorders nothing.
        ``again_after_hello=False``: only while the hello has not gone out (a
        broadcast, whose feeder pairs a late connection with its next call).
        """
        from ...base.security import NotTaken, handshake_timeout

        give_up = deadline if deadline is not None else time.monotonic() + 4 * handshake_timeout()
        pause = 0.05
        while True:  # bounded by give_up
            try:
                return transport.connect(endpoint, hello, deadline)
            except NotTaken as exc:
                if (exc.hello_sent and not again_after_hello) or time.monotonic() + pause >= give_up:
                    raise
                log.debug("connection to %s not taken in time; connecting again", endpoint.get("pid"))
                time.sleep(pause)
                pause = min(2 * pause, 1.0)

    def _drop_outgoing(self, pair: _Pair, link: Optional[Link]) -> None:
        """Forget ``link`` as the pair's outgoing link (unless another took its place) and close it."""
        if link is None:
            return
        with self._cond:
            if pair.link is link:
                pair.link = None
        link.close()
