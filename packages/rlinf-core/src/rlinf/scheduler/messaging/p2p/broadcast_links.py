"""The links of a broadcast, and the failures seen on them.

Receivers connect *upstream*, to the worker that feeds them (``_State.connect``,
carrying the release reports of ``broadcast_lending``); the feeding side finds
the connection in its inbox (``_State.accept``, a communicator service) and
takes it when its broadcast reaches that receiver (``_State.take``, probing a
peer that has not joined yet).  Broadcasts of one process run one at a time,
in call order (``async_op`` ones on a serial thread), so a process's
connections to a peer pair up with that peer's calls in order.

A feeder holds each receiver it feeds as a ``_Child``.  Acknowledgements
travel back up the same links and carry the failures seen below (a receiver
that refused ``out=``, one that died or timed out), so the source reports
every receiver that did not get the payload, by name (``_raise``), within
the operation's timeout.  A receiver that dies mid-way closes its link: its
feeder sees that at once, keeps serving the others and reports it.
"""

from __future__ import annotations

import json
import pickle
import threading
import time
from typing import Optional

from ...base.errors import CommTimeoutError, CommunicationError, PeerDiedError
from ...base.security import HandshakeError
from ...transports.ordering import SerialRunner, Turnstile
from .broadcast_lending import _Segments

SERVICE = "rlinf-broadcast"
#: seconds between liveness probes of a peer that has not joined yet
PROBE_INTERVAL = 1.0


class _State(_Segments):
    """One communicator's broadcast inbox, call order and segments (as a source and as a receiver)."""

    def __init__(self):
        super().__init__()
        self.cond = threading.Condition()
        self.inbox: dict[str, list] = {}  # connecting peer -> [(seq, link)], lowest seq first
        self.seq: dict[str, int] = {}  # peer -> seq of our next connection to it
        self.turnstile = Turnstile()
        self.runner = SerialRunner("rlinf-broadcast")

    def accept(self, link, info: dict) -> None:
        """A peer connected to be fed by us (called on the handshake thread: never blocks)."""
        try:
            peer, seq = str(info["src"]), int(info["seq"])
            released = [str(t) for t in info.get("released", ())]
        except (KeyError, TypeError, ValueError):
            link.close()
            return
        if released:
            self._returned(peer, released)
        stale = []
        with self.cond:
            entries = self.inbox.setdefault(peer, [])
            for entry in list(entries):
                if entry[1].peer_closed():  # a peer that gave up on an earlier broadcast
                    entries.remove(entry)
                    stale.append(entry[1])
            entries.append((seq, link))
            entries.sort(key=lambda e: e[0])
            self.cond.notify_all()
        for old in stale:
            old.close()

    def take(self, comm, addr, deadline: float):
        """The link ``addr`` opened to us for this broadcast; probes it while waiting."""
        name = addr.get_name()
        record = comm._lookup(addr)
        next_probe = time.monotonic() + PROBE_INTERVAL
        while True:
            stale = []
            with self.cond:
                link = None
                entries = self.inbox.get(name)
                while entries:
                    _seq, candidate = entries.pop(0)
                    if candidate.peer_closed():
                        stale.append(candidate)
                        continue
                    link = candidate
                    break
                if link is None:
                    now = time.monotonic()
                    if now >= deadline:
                        raise TimeoutError("it did not join the broadcast")
                    if now < next_probe:
                        self.cond.wait(min(next_probe, deadline) - now)
            for old in stale:
                old.close()
            if link is not None:
                return link
            if time.monotonic() >= next_probe:
                record = comm._check_alive(addr, record, "cpu")  # raises ConnectionError once it is gone
                next_probe = time.monotonic() + PROBE_INTERVAL

    def connect(self, comm, addr, deadline: float):
        """Open a link to ``addr``, which feeds us in this broadcast."""
        name = addr.get_name()
        with self.cond:
            seq = self.seq.get(name, 0)
            self.seq[name] = seq + 1
        released = self.released_to(name)
        hello = json.dumps({"service": SERVICE, "src": comm.name, "seq": seq, "released": released}).encode()
        transport = comm._transports["cpu"]
        try:
            # again while the feeder is too busy to begin; not once the hello went out: the feeder may take
            # that connection late, and another one under the same seq would pair with its next broadcast
            return type(comm)._connect(transport, comm._lookup(addr).endpoints["cpu"], hello, deadline,
                                       again_after_hello=False)
        except (ConnectionError, OSError) as exc:
            if isinstance(exc, (TimeoutError, HandshakeError)):
                # the feeder may have taken that connection already: another one under the same seq would pair
                # with its next broadcast, so fail this one instead
                raise
            # its group may have been relaunched under the same name: look again, once
            return transport.connect(comm._lookup(addr, refresh=True).endpoints["cpu"], hello, deadline)

    def close(self) -> None:
        super().close()
        with self.cond:
            links = [link for entries in self.inbox.values() for _s, link in entries]
            self.inbox.clear()
        for link in links:
            link.close()


# -- failures -------------------------------------------------------------------------
def _failure(comm, addr_name: str, addr, exc: BaseException, what: str) -> dict:
    who = comm._describe(addr) if addr is not None else repr(addr_name)
    if isinstance(exc, CommunicationError):
        kind = "timeout" if isinstance(exc, TimeoutError) else "died" if isinstance(exc, PeerDiedError) else "refused"
        return {"who": addr_name, "kind": kind, "text": str(exc)}
    if isinstance(exc, TimeoutError):
        return {"who": addr_name, "kind": "timeout", "text": f"{what} {who} timed out"}
    if isinstance(exc, (ConnectionError, OSError)):
        return {"who": addr_name, "kind": "died", "text": f"{what} {who} failed: {exc}"}
    return {"who": addr_name, "kind": "refused", "text": f"{who}: {type(exc).__name__}: {exc}"}


def _error_class(kinds: set) -> type:
    """The error to raise for failures of these kinds: a death outranks a timeout, a timeout a refusal."""
    return PeerDiedError if "died" in kinds else CommTimeoutError if "timeout" in kinds else CommunicationError


def _raise(comm, errors: list, timeout: float) -> None:
    if not errors:
        return
    cls = _error_class({e["kind"] for e in errors})
    from ...base.address import WorkerAddress

    names = "; ".join(comm._describe(WorkerAddress.from_name(n)) for n in sorted({e["who"] for e in errors}))
    text = "; ".join(e["text"] for e in errors[:8])
    raise cls(f"{comm.name}: broadcast (timeout {timeout:g} s) did not reach {names}: {text}", peer=errors[0]["who"])


class _Child:
    """A receiver we feed: its link, and the first failure seen on it (not raised: we keep serving the others)."""

    def __init__(self, comm, addr):
        self.comm, self.addr, self.name = comm, addr, addr.get_name()
        self.link = None
        self.error: Optional[dict] = None
        self.kept = False  # it keeps views of our segment (set by its acknowledgement)

    def join(self, state: _State, deadline: float) -> None:
        try:
            self.link = state.take(self.comm, self.addr, deadline)
        except Exception as exc:
            self.error = _failure(self.comm, self.name, self.addr, exc, "waiting for")

    def send(self, frames: list, deadline: float) -> None:
        if self.link is None:
            return
        try:
            self.link.send(frames, deadline)
        except Exception as exc:
            self._fail(exc, "sending to")

    def send_fds(self, frames: list, fds: list, deadline: float) -> None:
        if self.link is None:
            return
        try:
            self.link.send_fds(frames, fds, deadline)
        except Exception as exc:
            self._fail(exc, "sending to")

    def _fail(self, exc: BaseException, what: str) -> None:
        self.error = self.error or _failure(self.comm, self.name, self.addr, exc, what)
        link, self.link = self.link, None
        link.close()

    def acknowledgement(self, deadline: float) -> list:
        """The failures at and below this child (empty: all got it); closes the link."""
        self.kept = False
        if self.link is not None:
            try:
                _raw, frames = self.link.recv(deadline)
                # the link came from the cpu transport's listener: the peer passed the cluster-secret
                # handshake before any frame was read, so this unpickles only a cluster member's bytes
                ack = pickle.loads(bytes(frames[0]))
                errors, self.kept = ack["errors"], ack.get("kept", False)
            except Exception as exc:
                self._fail(exc, "waiting for the acknowledgement of")
            else:
                self.link.close()
                self.link = None
                return errors
        return [self.error] if self.error else []
