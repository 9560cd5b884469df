"""The per-process communicator: connections, ordering, timeouts, errors.

Each worker process has one.  At start-up it listens on every usable CPU
transport and publishes the endpoints in the group registry.  Sending to a
worker connects to that worker on first use (lazily) and keeps the
connection; the receiving side learns of the connection from the hello.
Each direction of each pair is one connection, so messages between one
sender and one receiver arrive in send order, and both directions run at
once without deadlock.
"""

from __future__ import annotations

import json
import logging
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .. import config, context
from ..address import WorkerAddress
from ..errors import CommTimeoutError, CommunicationError, PeerDiedError
from ..plugins import get_registry
from . import codec
from .async_work import AsyncWork
from .ordering import SerialRunner, Turnstile
from .transport import Link, Transport

log = logging.getLogger("rlinf.p2p")

#: seconds between liveness probes of a peer we are waiting for
PROBE_INTERVAL = 1.0
_FINGERPRINT = struct.Struct("<16sQ")


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
    lock: threading.Lock = field(default_factory=threading.Lock)

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
        self._transports: dict[str, Transport] = {}
        self._endpoints: dict[str, dict] = {}
        self._out: dict[str, _Pair] = {}
        self._in: dict[str, _Pair] = {}
        self._cond = threading.Condition()
        self._groups: dict[str, Any] = {}
        self._transport_names: dict = {}
        self._services: dict[str, Callable] = {}
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

    def endpoints(self) -> dict:
        return dict(self._endpoints)

    # -- peers -------------------------------------------------------------------
    def _lookup(self, peer: WorkerAddress, refresh: bool = False):
        key = peer.group_key
        record = None if refresh else self._groups.get(key)
        if record is None:
            from ..cluster import current_session

            record = current_session().lookup_group(key)
            if record is None:
                raise CommunicationError(
                    f"{self.name}: no group named {key!r} is running in this cluster "
                    f"(running groups: {current_session().list_groups()})",
                    peer=peer.get_name(),
                )
            self._groups[key] = record
        if peer.rank >= len(record.workers):
            raise CommunicationError(
                f"{self.name}: rank {peer.rank} is out of range for group {key!r} of {len(record.workers)} worker(s)",
                peer=peer.get_name(),
            )
        return record.workers[peer.rank]

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
            old = pair.link
            pair.link, pair.transport = link, transport
            self._cond.notify_all()
        if old is not None:
            old.close()

    def _outgoing(self, peer: WorkerAddress, transport: str, deadline: Optional[float]) -> _Pair:
        pair = self._pair(self._out, peer.get_name())
        if pair.link is not None and not pair.link.is_open():
            # the peer went away: forget the link and the peer's record, so that a
            # group relaunched under the same name is found and connected afresh
            pair.link.close()
            pair.link = None
            self._groups.pop(peer.group_key, None)
        if pair.link is not None and pair.transport == transport:
            return pair
        if pair.link is not None:
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
        pair.link = self._transports[transport].connect(endpoint, hello, deadline)
        pair.transport, pair.endpoint = transport, endpoint
        return pair

    def _send_frames(self, peer: WorkerAddress, transport: str, frames: list, deadline, raw: bool = False) -> None:
        """Send on the pair's link; if the peer's process was replaced (its group relaunched
        under the same name), reconnect to the new one and send there, once."""
        pair = self._outgoing(peer, transport, deadline)
        try:
            pair.link.send(frames, deadline, raw=raw)
            return
        except (ConnectionError, OSError) as exc:
            if isinstance(exc, TimeoutError):
                raise
            record = self._lookup(peer, refresh=True)
            if record.endpoints.get(transport) == pair.endpoint:
                raise
        pair.link.close()
        pair.link = None
        self._outgoing(peer, transport, deadline).link.send(frames, deadline, raw=raw)

    def _incoming(self, peer: WorkerAddress, transport: str, deadline: Optional[float]) -> _Pair:
        pair = self._pair(self._in, peer.get_name())
        if pair.link is not None and pair.transport == transport and pair.link.is_open():
            return pair
        if pair.link is not None and not pair.link.is_open():
            # a dead sender: fail now unless a relaunched one (same name) connects
            self._groups.pop(peer.group_key, None)
            with self._cond:
                if not pair.link.is_open():
                    pair.link = None
        record = self._lookup(peer)  # validates group and rank before waiting
        next_probe = time.monotonic() + PROBE_INTERVAL
        with self._cond:
            while pair.link is None:
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    raise TimeoutError("no connection from the peer")
                if now >= next_probe:
                    endpoint = record.endpoints.get(transport) or next(iter(record.endpoints.values()), None)
                    probe_with = self._transports.get(transport)
                    if endpoint is not None and probe_with is not None and not probe_with.probe(endpoint):
                        raise ConnectionError("the peer's process is gone")
                    next_probe = now + PROBE_INTERVAL
                wait = next_probe - now if deadline is None else min(next_probe, deadline) - now
                self._cond.wait(max(wait, 0.0))
        if pair.transport != transport:
            raise CommunicationError(
                f"{self.name}: {peer.get_name()!r} sends with transport {pair.transport!r} but this side "
                f"receives with {transport!r}; both ends of a pair must agree",
                peer=peer.get_name(),
            )
        return pair

    # -- operations --------------------------------------------------------------
    def _run(self, pair: _Pair, op: Callable, async_op: bool, what: str, peer: WorkerAddress, timeout: float):
        ticket = pair.turnstile.take()
        deadline = time.monotonic() + timeout
        if async_op:
            return AsyncWork(pair.serial().submit(lambda: self._guarded(pair, ticket, op, deadline, what, peer, timeout)),
                             f"{what} {peer.get_name()!r}")
        return self._guarded(pair, ticket, op, deadline, what, peer, timeout)

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
            raise CommTimeoutError(
                f"{self.name}: {what} {self._describe(peer)} timed out after {timeout:g} s{detail}",
                peer=peer.get_name(),
            ) from None
        except (ConnectionError, OSError) as exc:
            raise PeerDiedError(
                f"{self.name}: {what} {self._describe(peer)} failed: {exc}", peer=peer.get_name()
            ) from None
        finally:
            pair.turnstile.done(ticket)

    def send_object(self, obj: Any, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool):
        transport = self.transport_name(transport)
        try:
            header, buffers = codec.encode(obj)
            failure = None
        except Exception as exc:
            header, buffers = codec.encode(_SendFailure(f"{type(exc).__name__}: {exc}"))
            failure = exc
        pair = self._pair(self._out, peer.get_name())

        def op(deadline):
            self._send_frames(peer, transport, [header, *buffers], deadline)

        result = self._run(pair, op, async_op and failure is None, "sending to", peer, timeout)
        if failure is not None:
            raise TypeError(f"{self.name}: cannot send {type(obj).__name__} to {peer.get_name()!r}: {failure}") from failure
        return result

    def recv_object(self, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool):
        transport = self.transport_name(transport)
        pair = self._pair(self._in, peer.get_name())

        def op(deadline):
            p = self._incoming(peer, transport, deadline)
            raw, frames = p.link.recv(deadline)
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
            return obj

        return self._run(pair, op, async_op, "receiving from", peer, timeout)

    def send_tensor(self, tensor, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool):
        from . import codec

        transport = self.transport_name(transport)
        fingerprint = tensor_fingerprint(tensor)
        payload = codec.tensor_bytes(tensor)
        pair = self._pair(self._out, peer.get_name())

        def op(deadline):
            self._send_frames(peer, transport, [fingerprint, payload], deadline, raw=True)

        return self._run(pair, op, async_op, "sending a tensor to", peer, timeout)

    def recv_tensor(self, tensor, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool):
        from . import codec

        transport = self.transport_name(transport)
        expected = tensor_fingerprint(tensor)
        got = bytearray(_FINGERPRINT.size)
        target = codec.tensor_bytes(tensor)
        pair = self._pair(self._in, peer.get_name())

        def op(deadline):
            p = self._incoming(peer, transport, deadline)
            try:
                raw = p.link.recv_into([got, target], deadline)
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

        return self._run(pair, op, async_op, "receiving a tensor from", peer, timeout)

    def close(self) -> None:
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


def close_local_communicator() -> None:
    """Close this process's communicator (its worker is gone); the next worker gets a new one."""
    global _local
    with _local_lock:
        comm, _local = _local, None
    if comm is not None:
        comm.close()
