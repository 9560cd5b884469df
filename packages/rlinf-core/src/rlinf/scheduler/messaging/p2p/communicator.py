"""The per-process communicator: connections, ordering, timeouts, errors.

Each worker process has one.  At start-up it listens on every usable CPU
transport and publishes the endpoints in the group registry.  Sending to a
worker connects to that worker on first use (lazily) and keeps the
connection; the receiving side learns of the connection from the hello.
Each direction of each pair is one connection, so messages between one
sender and one receiver arrive in send order, and both directions run at
once without deadlock.

Nothing a peer sent is lost: when a sender reconnects (its send failed
midway, or its process was replaced by a relaunched group of the same name)
the receiver queues the new connection behind the old one and reads the old
one to its end first.  Links of peers that went away are closed the next
time a connection is made, so a long run with restarted workers does not
accumulate sockets or shared-memory mappings.

Links that carry nothing for ``RLINF_IDLE_LINK_TIMEOUT`` seconds are closed by
their sender, in the pair's turn (so never under a send), and the next send
connects again; the receiver reads the old link to its end before the new one,
so a close and reopen loses and reorders nothing.  One housekeeping thread per
process does this and closes incoming links whose sender left: descriptors
follow the peers a worker actually talks to, threads do not follow peers at all.
Group records are cached per group (``_lookup``): registry traffic follows the
groups a worker talks to, refreshed only when a peer looks gone or relaunched.

This module holds ``Communicator`` itself (its state and listeners, each
operation run in its pair's turn with errors that name the peer, and the hook
points where bytes move) and the process's one communicator.  Its parts:
``peers.py`` (lookup, waiting for a peer), ``links.py`` (the links in and out
and their housekeeping), ``messages.py`` (what ``send``/``recv`` put on a link).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from ...base import config, context, lifecycle
from ...base.address import WorkerAddress
from ...base.errors import CommTimeoutError, CommunicationError, PeerDiedError
from ...plugins import get_registry
from ...base.hooks import hook
from ...transports import device_routing
from ...transports.async_work import AsyncWork
from ...plugins.transport import Link, LinkClosed, Transport
from .links import LinksMixin, _Pair
from .messages import MessagesMixin
from .peers import PeersMixin

log = logging.getLogger("rlinf.p2p")

#: each operation's name (the timeline's) -> how its errors say what it was doing to the peer
_OPERATIONS = {"send": "sending to", "recv": "receiving from", "send_tensor": "sending a tensor to",
               "recv_tensor": "receiving a tensor from"}


class Communicator(MessagesMixin, LinksMixin, PeersMixin):
    """One process's point-to-point endpoint: the parts (mixins) share the state set up here."""

    def __init__(self, address: WorkerAddress, local_ip: str):
        self.address = address
        self.name = address.get_name()
        self._local_ip = local_ip
        self._transports: dict[str, Transport] = {}
        self._endpoints: dict[str, dict] = {}
        self._out: dict[str, _Pair] = {}
        self._in: dict[str, _Pair] = {}
        self._cond = threading.Condition()
        self._groups: dict[str, Any] = {}
        self._lookup_locks: dict[str, threading.Lock] = {}
        self._transport_names: dict = {}
        self._services: dict[str, Callable] = {}
        self._idle_timeout = config.idle_link_timeout()  # a bad value fails here, as the worker starts
        self._housekeeper: Optional[threading.Thread] = None
        self._closed = threading.Event()
        #: counters for tests and benchmarks: registry lookups made, links closed for being idle
        self.stats = {"registry_lookups": 0, "idle_closed": 0}
        registry = get_registry()
        for entry in registry.provided["transport"].values():
            if "cpu" not in entry.descriptor.devices or entry.unusable_reason():
                continue
            try:
                transport = entry.descriptor.factory()
                self._endpoints[entry.name] = transport.listen(self._on_accept, local_ip)
                self._transports[entry.name] = transport
            except Exception as exc:
                log.warning("transport %r could not start listening here: %s", entry.name, exc)
        from . import broadcast

        broadcast.install(self)  # broadcast connections arrive as a service (see broadcast.py)

    def endpoints(self) -> dict:
        return dict(self._endpoints)

    def transport_name(self, requested: Optional[str]) -> str:
        key = (requested, None if requested is not None else config.getenv(config.TRANSPORT_ENV))
        name = self._transport_names.get(key)
        if name is None:
            name = self._transport_names[key] = self._resolve_transport(requested)
        return name

    def _resolve_transport(self, requested: Optional[str]) -> str:
        entry = get_registry().transport(requested, "cpu")
        if entry.name not in self._transports:
            raise CommunicationError(f"{self.name}: transport {entry.name!r} is not listening in this process")
        return entry.name

    # -- where bytes move (hook points: tracing wraps these by name) ----------------
    @hook("p2p_send")
    def _send_frames(self, peer: WorkerAddress, transport: str, frames: list, deadline, raw: bool = False) -> None:
        """Send on the pair's link; if the peer's process was replaced (its group relaunched
        under the same name), connect to the new one and send there, once."""
        pair = self._pair(self._out, peer.get_name())
        link = None
        try:
            pair, link = self._outgoing(peer, transport, deadline)
            link.send(frames, deadline, raw=raw)
            return
        except (ConnectionError, OSError) as exc:
            if isinstance(exc, TimeoutError):
                raise  # the link itself says whether it is still usable (is_open)
            tried = pair.endpoint  # what we connected (or tried to connect) to
            record = self._relookup(peer, f"{exc}; ")
            if record.endpoints.get(transport) == tried:
                self._drop_outgoing(pair, link)  # the peer is gone: free the link's shared memory now
                raise
        self._drop_outgoing(pair, link)  # the peer was replaced: connect to the new one, once
        self._outgoing(peer, transport, deadline)[1].send(frames, deadline, raw=raw)

    @hook("p2p_recv")
    def _receive(self, peer: WorkerAddress, transport: str, deadline: Optional[float], read: Callable[[Link], Any]):
        """``read(link)`` on the peer's current link; a link that ended hands over to the next one."""
        pair = self._pair(self._in, peer.get_name())
        ended = False
        while True:
            link = self._incoming(peer, transport, deadline, ended)
            try:
                return read(link)
            except LinkClosed:
                self._retire(pair, link)
                ended = True

    # -- operations --------------------------------------------------------------
    def _run(self, pair: _Pair, op: Callable, async_op: bool, kind: str, peer: WorkerAddress, timeout: float):
        """Run ``op`` in its turn on the pair: now, or (``async_op``) on the pair's serial runner.

        ``kind`` is the operation (``_OPERATIONS``)."""
        ticket = pair.turnstile.take()
        deadline = time.monotonic() + timeout
        if async_op:
            return self._submit(pair, ticket, op, deadline, kind, peer, timeout)
        return self._guarded(pair, ticket, op, deadline, _OPERATIONS[kind], peer, timeout)

    @hook("p2p_async")
    def _submit(self, pair: _Pair, ticket: int, op: Callable, deadline: float, kind: str, peer: WorkerAddress,
                timeout: float) -> AsyncWork:
        """An ``async_op=True`` operation, queued on the pair's serial runner (the timeline's span of it
        runs from here until it completes; blocking operations never pass here)."""
        what = _OPERATIONS[kind]
        return AsyncWork(pair.serial().submit(lambda: self._guarded(pair, ticket, op, deadline, what, peer, timeout)),
                         f"{what} {peer.get_name()!r}")

    def _guarded(self, pair: _Pair, ticket: int, op: Callable, deadline: float, what: str, peer: WorkerAddress,
                 timeout: float):
        """Run ``op`` in its turn; turn transport failures into errors that name the peer."""
        try:
            pair.turnstile.wait_turn(ticket, deadline)
            return op(deadline)
        except CommunicationError:
            raise
        except TimeoutError as exc:
            detail = str(exc)
            detail = f" ({detail})" if detail and detail not in ("deadline passed", "timed out") else ""
            left = deadline - time.monotonic()
            when = (f"timed out after {timeout:g} s" if left <= 1.0 else  # else a step with a limit of its own
                    f"timed out {timeout - left:.1f} s in, {left:.0f} s before its deadline: {type(exc).__name__}")
            raise CommTimeoutError(
                f"{self.name}: {what} {self._describe(peer)} {when}{detail}",
                peer=peer.get_name(),
            ) from None
        except (ConnectionError, OSError) as exc:
            raise PeerDiedError(
                f"{self.name}: {what} {self._describe(peer)} failed: {exc}", peer=peer.get_name()
            ) from None
        finally:
            pair.turnstile.done(ticket)

    def close(self) -> None:
        self._closed.set()
        state = getattr(self, "broadcast_state", None)
        if state is not None:
            state.close()
        for transport in self._transports.values():
            transport.close()


_local: Optional[Communicator] = None
_local_lock = threading.Lock()


def local_communicator(create: bool = False) -> Optional[Communicator]:
    """This process's communicator; created on first use inside a worker."""
    global _local
    if _local is not None:  # the common case, without the lock
        return _local
    with _local_lock:
        if _local is None and create:
            ctx = context.current()
            if ctx is None:
                raise CommunicationError(
                    "point-to-point communication is available inside workers only (this process hosts no worker)"
                )
            _local = Communicator(ctx.address, ctx.info.node_ip)
        return _local


@lifecycle.on_release
def close_local_communicator() -> None:
    """Close this process's communicator (its worker is gone); the next worker gets a new one."""
    global _local
    with _local_lock:
        comm, _local = _local, None
    if comm is not None:
        comm.close()
        device_routing.close_routers()
