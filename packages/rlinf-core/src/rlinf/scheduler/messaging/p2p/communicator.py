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
"""

from __future__ import annotations

import collections
import json
import logging
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ...base import config, context, lifecycle
from ...base.address import WorkerAddress
from ...base.errors import CommTimeoutError, CommunicationError, PeerDiedError
from ...plugins.launcher import current_session
from ...plugins import get_registry
from ...base.hooks import hook
from ...transports import codec, device_routing
from ...transports.async_work import AsyncWork
from ...transports.ordering import SerialRunner, Turnstile
from ...plugins.transport import Link, LinkClosed, Transport

log = logging.getLogger("rlinf.p2p")

#: seconds between liveness probes of a peer we are waiting for
PROBE_INTERVAL = 1.0
_FINGERPRINT = struct.Struct("<16sQ")
#: each operation's name (the timeline's) -> how its errors say what it was doing to the peer
_OPERATIONS = {"send": "sending to", "recv": "receiving from", "send_tensor": "sending a tensor to",
               "recv_tensor": "receiving a tensor from"}


class _SendFailure:
    """Sent in place of an object that could not be serialized, so the receiver fails at once."""

    def __init__(self, text: str):
        self.text = text


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


def tensor_fingerprint(tensor) -> bytes:
    """16 bytes naming dtype and shape, so a mismatched ``recv_tensor`` fails instead of filling garbage."""
    dtype = str(tensor.dtype).rsplit(".", 1)[-1].encode()[:16]
    return _FINGERPRINT.pack(dtype, zlib.crc32(repr(tuple(tensor.shape)).encode()))


class Communicator:
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

    # -- peers -------------------------------------------------------------------
    def _lookup(self, peer: WorkerAddress, refresh: bool = False):
        key = peer.group_key
        record = None if refresh else self._groups.get(key)
        if record is None:
            with self._cond:
                lock = self._lookup_locks.setdefault(key, threading.Lock())
            # one fetch per group at a time: the other senders of an all-to-all wait for it instead of
            # asking too (bounded: the launcher bounds every registry request)
            with lock:
                record = None if refresh else self._groups.get(key)
                if record is None:
                    record = self._fetch(peer)
        if peer.rank >= len(record.workers):
            raise CommunicationError(
                f"{self.name}: rank {peer.rank} is out of range for group {key!r} of {len(record.workers)} worker(s)",
                peer=peer.get_name(),
            )
        return record.workers[peer.rank]

    def _fetch(self, peer: WorkerAddress):
        key = peer.group_key
        self.stats["registry_lookups"] += 1
        record = current_session().lookup_group(key)
        if record is None:
            raise CommunicationError(
                f"{self.name}: no group named {key!r} is running in this cluster "
                f"(running groups: {current_session().list_groups()})",
                peer=peer.get_name(),
            )
        self._groups[key] = record
        return record

    def _describe(self, peer: WorkerAddress) -> str:
        try:
            info = self._lookup(peer).info
            return f"worker {peer.get_name()!r} (group {peer.group_key!r} rank {peer.rank}, node {info.node_id}, {info.node_ip}, pid {info.pid})"
        except CommunicationError:
            return f"worker {peer.get_name()!r}"

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
        """Close idle outgoing links and ended incoming ones, and unmap broadcast segments kept from
        sources gone quiet, a few times per idle timeout."""
        interval = min(5.0, max(0.05, self._idle_timeout / 4))
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

    def _promote(self, pair: _Pair) -> None:
        """The current incoming link has ended: the next queued one takes its place (lock held)."""
        pair.link, pair.transport = pair.queued.popleft() if pair.queued else (None, pair.transport)

    def _retire(self, pair: _Pair, link: Link) -> None:
        """``link`` delivered everything it will: close it and move on to the next one."""
        with self._cond:
            if pair.link is link:
                self._promote(pair)
        link.close()

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
            try:
                record = self._lookup(peer, refresh=True)
            except CommunicationError:
                raise ConnectionError(f"{exc}; its group is no longer running") from None
            if record.endpoints.get(transport) == tried:
                self._drop_outgoing(pair, link)  # the peer is gone: free the link's shared memory now
                raise
        if link is not None:
            link.close()
        with self._cond:
            if pair.link is link:
                pair.link = None
        self._outgoing(peer, transport, deadline)[1].send(frames, deadline, raw=raw)

    def _drop_outgoing(self, pair: _Pair, link: Optional[Link]) -> None:
        if link is None:
            return
        with self._cond:
            if pair.link is link:
                pair.link = None
        link.close()

    def _incoming(self, peer: WorkerAddress, transport: str, deadline: Optional[float], ended: bool = False) -> Link:
        """The link to receive from ``peer`` on, waiting for the peer to connect.

        ``ended``: the previous link from this peer just ended, so a peer whose
        process is gone is reported at once instead of after a probe interval.
        """
        pair = self._pair(self._in, peer.get_name())
        link = pair.link
        if link is None:
            # after a link ended, the cached record stays: the probe below refreshes it only if the
            # sender's process is gone (a relaunched group), so an idle close costs no registry call
            try:
                record = self._lookup(peer)  # validates group and rank before waiting
            except CommunicationError:
                if ended:
                    raise ConnectionError("its group is no longer running") from None
                raise
            next_probe = time.monotonic() + (0.0 if ended else PROBE_INTERVAL)
            while True:
                with self._cond:
                    if pair.link is not None:
                        link = pair.link
                        break
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        raise TimeoutError("no connection from the peer")
                    if now < next_probe:
                        self._cond.wait(next_probe - now if deadline is None else min(next_probe, deadline) - now)
                        continue
                record = self._check_alive(peer, record, transport)  # outside the lock: it may take a while
                next_probe = time.monotonic() + PROBE_INTERVAL
        if pair.transport != transport:
            raise CommunicationError(
                f"{self.name}: {peer.get_name()!r} sends with transport {pair.transport!r} but this side "
                f"receives with {transport!r}; both ends of a pair must agree",
                peer=peer.get_name(),
            )
        return link

    def _check_alive(self, peer: WorkerAddress, record, transport: str):
        """Probe the process we wait for; return the record to keep waiting on, or raise if it is gone.

        A process that is gone may have been replaced by a relaunched group of
        the same name, which is about to connect: then wait for the new one.
        """
        endpoint = record.endpoints.get(transport) or next(iter(record.endpoints.values()), None)
        probe_with = self._transports.get(transport)
        if endpoint is None or probe_with is None or probe_with.probe(endpoint):
            return record
        try:
            fresh = self._lookup(peer, refresh=True)
        except CommunicationError:
            raise ConnectionError("its group is no longer running") from None
        if fresh.endpoints == record.endpoints:
            raise ConnectionError("the peer's process is gone")
        return fresh

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

    def send_object(self, obj: Any, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool,
                    options=None):
        transport = self.transport_name(transport)
        if device_routing.may_hold_device_tensors(obj) and device_routing.needs_device_path(obj):
            return self._send_with_device_tensors(obj, peer, transport, timeout, async_op, options)
        try:
            header, buffers = codec.encode(obj)
            failure = None
        except Exception as exc:
            header, buffers = codec.encode(_SendFailure(f"{type(exc).__name__}: {exc}"))
            failure = exc
        pair = self._pair(self._out, peer.get_name())

        def op(deadline):
            self._send_frames(peer, transport, [header, *buffers], deadline)

        result = self._run(pair, op, async_op and failure is None, "send", peer, timeout)
        if failure is not None:
            raise TypeError(f"{self.name}: cannot send {type(obj).__name__} to {peer.get_name()!r}: {failure}") from failure
        return result

    def _send_with_device_tensors(self, obj: Any, peer: WorkerAddress, transport: str, timeout: float, async_op: bool,
                                  options=None):
        """Metadata on this pair's CPU path, device tensors on a device link (see ``device_routing``).

        ``options`` (``CollectiveGroupOptions``) the device transport cannot honour fail here, before anything is sent.
        """
        pair = self._pair(self._out, peer.get_name())
        fields = device_routing.router().link_options(options) if options is not None else {}

        def op(deadline):
            def send_meta(envelope):
                header, buffers = codec.encode(envelope)
                self._send_frames(peer, transport, [header, *buffers], deadline)

            device_routing.router().send(send_meta, obj, self.name, peer.get_name(), deadline, self._local_ip,
                                         options=fields)

        return self._run(pair, op, async_op, "send", peer, timeout)

    def recv_object(self, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool,
                    options=None):
        transport = self.transport_name(transport)
        pair = self._pair(self._in, peer.get_name())
        fields = _receiving_fields(options)

        def op(deadline):
            raw, frames = self._receive(peer, transport, deadline, lambda link: link.recv(deadline))
            if raw:
                raise CommunicationError(
                    f"{self.name}: {peer.get_name()!r} sent a tensor with send_tensor(), but this side called recv(); "
                    f"use recv_tensor() for it",
                    peer=peer.get_name(),
                )
            obj = codec.decode(frames[0], frames[1:])
            if isinstance(obj, _SendFailure):
                raise CommunicationError(
                    f"{self.name}: {self._describe(peer)} failed to serialize the object it sent: {obj.text}",
                    peer=peer.get_name(),
                )
            if isinstance(obj, device_routing.DeviceEnvelope):  # its device tensors follow on a device link
                router = device_routing.router()
                obj = router.unwrap(obj, self.name, deadline, options=_lenient_fields(router, options, fields))
            return obj

        return self._run(pair, op, async_op, "recv", peer, timeout)

    def send_tensor(self, tensor, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool,
                    options=None):
        from ...transports import codec

        transport = self.transport_name(transport)
        if tensor.device.type != "cpu":  # announced on the CPU path, moved on a device link
            return self._send_with_device_tensors(tensor, peer, transport, timeout, async_op, options)
        fingerprint = tensor_fingerprint(tensor)
        payload = codec.tensor_bytes(tensor)
        pair = self._pair(self._out, peer.get_name())

        def op(deadline):
            self._send_frames(peer, transport, [fingerprint, payload], deadline, raw=True)

        return self._run(pair, op, async_op, "send_tensor", peer, timeout)

    def recv_tensor(self, tensor, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool,
                    options=None):
        from ...transports import codec

        transport = self.transport_name(transport)
        if tensor.device.type != "cpu":
            return self._recv_device_tensor(tensor, peer, transport, timeout, async_op, options)
        expected = tensor_fingerprint(tensor)
        got = bytearray(_FINGERPRINT.size)
        target = codec.tensor_bytes(tensor)
        pair = self._pair(self._in, peer.get_name())

        def op(deadline):
            try:
                raw = self._receive(peer, transport, deadline, lambda link: link.recv_into([got, target], deadline))
            except ValueError as exc:
                raise CommunicationError(
                    f"{self.name}: recv_tensor from {peer.get_name()!r} into a {tuple(tensor.shape)} {tensor.dtype} "
                    f"buffer does not match what was sent ({exc}); the message was discarded",
                    peer=peer.get_name(),
                ) from None
            if not raw:
                raise CommunicationError(
                    f"{self.name}: {peer.get_name()!r} sent an object with send(), but this side called recv_tensor(); "
                    f"the message was discarded",
                    peer=peer.get_name(),
                )
            if bytes(got) != expected:
                dtype = _FINGERPRINT.unpack(bytes(got))[0].rstrip(b"\0").decode(errors="replace")
                raise CommunicationError(
                    f"{self.name}: recv_tensor from {peer.get_name()!r}: the sender's tensor ({dtype}) has another "
                    f"dtype or shape than the {tuple(tensor.shape)} {tensor.dtype} buffer given here",
                    peer=peer.get_name(),
                )
            return tensor

        return self._run(pair, op, async_op, "recv_tensor", peer, timeout)

    def _recv_device_tensor(self, tensor, peer: WorkerAddress, transport: str, timeout: float, async_op: bool,
                            options=None):
        """``recv_tensor`` into a device buffer: the announcement on the CPU path, the data on a device link."""
        pair = self._pair(self._in, peer.get_name())
        fields = device_routing.router().link_options(options) if options is not None else {}

        def op(deadline):
            raw, frames = self._receive(peer, transport, deadline, lambda link: link.recv(deadline))
            envelope = None if raw else codec.decode(frames[0], frames[1:])
            if not isinstance(envelope, device_routing.DeviceEnvelope):
                raise CommunicationError(
                    f"{self.name}: recv_tensor into a {tensor.device} buffer from {peer.get_name()!r}, which sent "
                    f"{'a CPU tensor' if raw else 'an object'}; send_tensor a tensor on a device to fill a device "
                    f"buffer (the message was discarded)",
                    peer=peer.get_name(),
                )
            try:
                device_routing.router().receive_into(envelope, tensor, self.name, deadline, options=fields)
            except ValueError as exc:
                raise CommunicationError(
                    f"{self.name}: recv_tensor from {peer.get_name()!r}: {exc}", peer=peer.get_name()) from None
            return tensor

        return self._run(pair, op, async_op, "recv_tensor", peer, timeout)

    def close(self) -> None:
        self._closed.set()
        state = getattr(self, "broadcast_state", None)
        if state is not None:
            state.close()
        for transport in self._transports.values():
            transport.close()


def _receiving_fields(options) -> Optional[dict]:
    """A receiving call's tuning fields, checked against the device transport now when this process
    can hold device tensors (so a field it cannot honour fails before anything is received); else
    None: they are looked at only if a device envelope arrives."""
    if options is None or not options.transport_options():
        return {}
    if device_routing.may_hold_device_tensors(None):
        return device_routing.router().link_options(options)
    return None


def _lenient_fields(router, options, fields: Optional[dict]) -> dict:
    """The fields for a link set up on receipt: those checked up front, else those the transport honours."""
    if fields is not None:
        return fields
    from ...plugins.options import LINK_FIELDS, honoured

    can = honoured(router.entry.descriptor)
    return {k: v for k, v in options.transport_options().items() if k in LINK_FIELDS and k in can}


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
