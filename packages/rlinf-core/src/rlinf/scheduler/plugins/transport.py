"""The transport interface: how a plugin moves buffers between two processes.

Core does everything else: message format (``codec``), per-pair ordering,
async work, timeouts and error messages.  A transport implements three
small things:

* ``listen(on_accept, local_ip)``: start accepting connections; return the endpoint
  info (a JSON-able dict) that core publishes in the group registry.
  ``on_accept(link, hello)`` is called for each incoming connection with the
  hello bytes the connecting side sent.
* ``connect(endpoint, hello, timeout)``: connect to a peer's published
  endpoint and deliver ``hello`` to it; return a ``Link``.
* ``Link``: one connection.  ``send(frames)`` delivers one message made of
  buffers; ``recv()`` returns the next message as a list of buffers (which may
  be views of shared memory: the transport learns when they are freed through
  the objects it returns); ``recv_into(targets)`` fills preallocated buffers.
  Every blocking method takes ``deadline`` (``time.monotonic()`` based) and
  raises ``TimeoutError`` past it, and raises ``ConnectionError`` when the peer
  goes away.  Core names the peer in both cases.

What core relies on, so that nothing a peer sent is lost:

* ``recv`` delivers every complete message the peer sent before it closed
  the link (or its process exited), and only then raises ``LinkClosed``.
* A ``recv``/``recv_into`` that times out, even midway through a message,
  leaves the stream intact: the next receive gets that message whole.
* A ``send`` that times out before any byte left leaves the link usable; one
  that fails midway makes ``is_open()`` false and ends the stream so the
  receiver drops the torn message (it then sees ``LinkClosed``).  Core
  reconnects for the next send, and the receiver reads the new link only
  after the old one ended, so order is kept.

Device transports (``TransportPlugin.devices`` naming ``"cuda"``) add what
moving accelerator memory needs, through ``DeviceLink``:

* a rendezvous through the existing CPU connection: a device transport wraps
  the built-in ``cpu`` transport (its endpoint is published inside the device
  transport's own, e.g. ``{"cpu": {...}, "backend": "nccl"}``) and sets up its
  device channel (an NCCL communicator, a CUDA IPC handle) over that link, so
  the peer is checked the same way and small metadata keeps using it;
* device buffers: ``send_tensors`` / ``recv_tensors_into`` take tensors in
  device memory (never staged through the host);
* streams: both are ordered against the caller's *current* stream with
  events: the transfer starts after the work already queued on that stream,
  and work queued on it after the call sees the received data.  The call may
  return before the copy finishes on the device (as NCCL does); the deadline
  bounds the host-side wait and any setup.
"""

from __future__ import annotations

import socket
import time
from abc import ABC, abstractmethod
from typing import Callable, Optional, Sequence

#: bytes a read-ahead budget charges for each message on top of its payload, so that a budget in
#: bytes also bounds the memory of many small (or empty) messages read ahead
READ_AHEAD_MESSAGE_COST = 256


class LinkClosed(ConnectionError):
    """The peer closed the link, and every complete message it sent has been received."""


class LinkBusy(TimeoutError):
    """Another thread's send (or receive) held the link until this one's deadline; nothing of it was sent."""


class HeldWithin:
    """``with HeldWithin(lock, deadline, "send"):`` one operation on a link at a time.

    Waits for another thread's operation on the same ``lock`` at most until
    ``deadline`` (``LinkBusy`` then, nothing done; None: as long as that one
    takes, which ends by its own deadline).  ``lock`` must be a
    ``threading.RLock``, not held by the calling thread already: an interrupt
    (Ctrl-C) that lands just after the lock was taken, before the ``with``
    block began, then releases it instead of leaving it held for good.
    """

    __slots__ = ("_lock", "_deadline", "_what")

    def __init__(self, lock, deadline: Optional[float], what: str):
        self._lock, self._deadline, self._what = lock, deadline, what

    def __enter__(self) -> None:
        lock, deadline = self._lock, self._deadline
        if lock._is_owned():
            raise RuntimeError(f"a {self._what} on a link inside another one on the same thread")
        try:
            if lock.acquire(False) or lock.acquire(timeout=-1 if deadline is None else max(0.0, deadline - time.monotonic())):
                return
        except BaseException:
            if lock._is_owned():  # taken, and interrupted before the block could own it
                lock.release()
            raise
        raise LinkBusy(f"another {self._what} on this link held it until the deadline")

    def __exit__(self, *exc) -> None:
        self._lock.release()


class Link(ABC):
    """A connection to one peer carrying whole messages in order."""

    @abstractmethod
    def send(self, frames: Sequence, deadline: Optional[float], raw: bool = False) -> None:
        """Send one message.  ``raw`` marks a ``send_tensor`` message (no object header).

        ``deadline`` bounds the whole send, including a wait for another
        thread's send on the same link (``LinkBusy`` if that wait ran out);
        ``TimeoutError`` with the link still open means nothing of the
        message was sent."""

    @abstractmethod
    def recv(self, deadline: Optional[float]) -> tuple[bool, list]:
        """Receive one message: ``(raw, buffers)``.

        ``deadline`` bounds the whole receive, including a wait for another
        thread's receive on the same link (``LinkBusy``)."""

    @abstractmethod
    def recv_into(self, targets: Sequence, deadline: Optional[float]) -> bool:
        """Receive one message straight into ``targets`` (writable buffers).

        Returns the message's ``raw`` flag; raises ``ValueError`` (and consumes
        the message) if the sizes do not match the targets.
        """

    def is_open(self) -> bool:
        """False once the link failed (peer gone, a send broke midway): rlinf then reconnects."""
        return True

    def peer_closed(self) -> bool:
        """Whether the peer has closed the link and nothing it sent is left to receive.

        Must not block or consume data.  Core polls idle links with it to close
        those of departed peers; the default (never) keeps them until a send or
        receive fails.
        """
        return False

    def send_now(self, frames: Sequence) -> bool:
        """Send a small message only if it can leave whole at once, without waiting; else send nothing.

        For an event loop that must never wait on a peer (the channel host
        answers small requests this way instead of handing each reply to a
        sender thread).  True: sent, as ``send`` would have.  False: nothing
        was sent and the link is as it was.  Raises as ``send`` does when the
        link has failed.  The default never sends.
        """
        return False

    def last_progress(self) -> float:
        """When (``time.monotonic``) the peer was last seen moving bytes: ours (taken off full
        buffers, not merely queued) or its own; 0.0 if the link cannot tell.

        A peer in the middle of a long message, taking ours or sending its
        own, is alive though no whole message comes: the channel client
        counts this as hearing from its host.
        """
        return 0.0

    def poll_fd(self) -> Optional[int]:
        """A descriptor that turns readable when data arrives, so one event loop can serve many links.

        Only for links whose ``recv_nowait`` works; the default (None) means
        the link must be read by a thread of its own.
        """
        return None

    def detach(self) -> Optional[socket.socket]:
        """Hand the connected stream socket under this link to the caller, for good, or None.

        For a service that, once both ends agree, exchanges a plain byte
        stream on an authenticated same-host connection (the channel's
        acknowledgements: fixed-size records, no framing).  Only where
        nothing was read ahead of the caller; what the link owed the peer
        is sent first.  The link is unusable afterwards and its transport
        forgets it: the caller closes the socket.  The default: None (the
        link stays as it was).
        """
        return None

    def recv_nowait(self) -> Optional[tuple[bool, list]]:
        """The next message if it has arrived whole, else None at once (no wait, nothing lost).

        Only called where ``poll_fd`` is not None.
        """
        raise NotImplementedError

    @abstractmethod
    def close(self) -> None: ...


class DeviceLink(ABC):
    """What a device transport's ``Link`` adds: tensors in device memory, no host staging.

    A link of a device transport implements both ``Link`` (host frames: the
    metadata path) and ``DeviceLink`` (the payload path).
    """

    @abstractmethod
    def send_tensors(self, tensors: Sequence, deadline: Optional[float]) -> None:
        """Send contiguous device tensors, in order, ordered after the caller's current stream."""

    @abstractmethod
    def recv_tensors_into(self, tensors: Sequence, deadline: Optional[float]) -> None:
        """Fill preallocated device tensors (same sizes as sent); the caller's current stream waits for the data."""


class Transport(ABC):
    """A buffer mover between processes, provided by a ``TransportPlugin``."""

    name: str = ""

    @abstractmethod
    def listen(self, on_accept: Callable[[Link, bytes], None], local_ip: str) -> dict:
        """Start accepting connections on ``local_ip`` (this node's address); return endpoint info to publish."""

    @abstractmethod
    def connect(self, endpoint: dict, hello: bytes, deadline: Optional[float]) -> Link:
        """Connect to a peer's endpoint and send ``hello``; return once the peer's ``on_accept`` took it.

        Returning only then is what keeps messages in order when a sender
        reconnects (after an idle close, or a send that failed midway): the
        receiver reads its connections from one sender in the order they were
        taken, so a connection made after this returns must be taken after
        it.  Listeners that run handshakes on several threads need an
        acknowledgement for this (``security.await_accepted``, sent once
        ``on_accept`` returned, before any other byte).
        """

    def probe(self, endpoint: dict) -> bool:
        """Whether the peer behind ``endpoint`` still seems alive (used while waiting for it)."""
        return True

    def close(self) -> None:
        """Stop listening and close every link."""
