"""How a channel client acknowledges the items it hands to its user (a part of ``client.ChannelClient``).

An acknowledgement is handed to a connection before the item reaches the
user, so no way the process ends (returning, stopped, exiting, killed) has
the item delivered again: the host applies every whole message a departed
client left before it puts that client's items back.

Once the connection is fed ahead (see ``feeding``), acknowledgements go on a
second connection to the host, the *ack link*, which the host does not wait
on: it reads it before anything else it does for the client (each message on
the main connection, a feed whose window looks full, a ``qsize``), on every
check of its connections, and to the end when the client goes.  An ack then
wakes no one, which on the main connection had cost a wake-up of the host
per item taken.  A client that acknowledged quietly and then waits for a fed
item says ``more`` on the main connection, so the host reads the
acknowledgements and refills the feed.  The ack link is opened by the
heartbeat thread (never on a caller's path) and used once the host confirms
it; until then acknowledgements go on the main connection.

Once confirmed, both ends take the ack link's socket over (``Link.detach``):
an acknowledgement is a bare little-endian int64 item id, 8 bytes written
straight to the socket, with no message framing (a send costs about a
quarter of a framed one, and the host reads thousands in one ``recv``).
The socket was authenticated as the link was, and is a same-host one (ack
links exist only on links with a descriptor to poll, which the built-in
transport gives only to Unix sockets), so nothing but this client writes to
it.  A write that cannot finish gives the whole connection up, as a torn
message would.
"""

from __future__ import annotations

import collections
import select
import struct
import threading
import time
from typing import Callable, Optional

from ...base.errors import PeerDiedError
from .protocol import DIRECT_BASE, pack

_ONE = struct.Struct("<q")  # one acknowledgement: an item id
#: acks of direct items after which the next wait says ``more`` (the host reads the ack link then; it
#: reads it on its own only 4 times a second, and a Unix socket holds only a few hundred small writes
#: where the system caps its buffer at the usual 208 KiB)
DIRECT_ACKS_UNREAD = 128


class _Acks:
    """The acknowledging side of ``ChannelClient`` (uses its links, send timeout and failure handling)."""

    def _init_acks(self) -> None:
        #: replies whose items reached the user, not yet acknowledged: ride on the next request, or the next heartbeat tick
        self._acks: collections.deque = collections.deque()
        self._ack_link = None  # the ack link's socket, once the host confirmed it
        self._ack_offered = None  # the ack link's socket, opened, awaiting the host's confirmation
        self._ack_write_lock = threading.Lock()
        self._ack_confirmed = False  # the host confirmed it (which may be read before the dial returns)
        #: opens an ack link to the host (set by ``connect``; None: this connection has none)
        self._dial_acks: Optional[Callable] = None
        self._acked_quietly = False  # an ack went on the ack link since the last message on the main one
        self._direct_quiet = 0  # acks of direct items on the ack link since ``_acked_quietly`` was last set for them

    def ack(self, rid: int) -> None:
        """The items of reply (or fed item) ``rid`` are about to reach the user: the host forgets them.

        The acknowledgement is handed to a connection before this returns
        (with any queued ones).  Raises ``PeerDiedError`` if it cannot be
        sent because the connection is lost (the host puts the items back:
        the caller must not hand them over).  If another thread's send holds
        the main connection for the send timeout, it is queued and rides on
        the next message instead.
        """
        acks = self._take_acks() if self._acks else []
        acks.append(rid)
        if self._dead is not None:
            raise PeerDiedError(self._dead, peer=self.host)
        quiet = self._ack_link
        try:
            if quiet is not None:
                self._write_acks(quiet, _ONE.pack(rid) if len(acks) == 1 else struct.pack(f"<{len(acks)}q", *acks))
                if rid < DIRECT_BASE or len(acks) > 1:  # a direct item takes no room in the host's window,
                    self._acked_quietly = True
                else:  # but the host must read its acks now and then: their socket's buffer is not endless
                    self._direct_quiet += 1
                    if self._direct_quiet >= DIRECT_ACKS_UNREAD:
                        self._direct_quiet, self._acked_quietly = 0, True
            else:
                self._send([pack({"id": 0, "op": "ack", "ids": acks})], self._send_timeout)
        except BaseException as exc:
            if quiet is None and isinstance(exc, TimeoutError) and self._link.is_open():
                self._acks.extendleft(reversed(acks))  # nothing of it was sent: rides on the next message
                if rid >= DIRECT_BASE:  # the user has it: its producer must not hand a copy to the host
                    self._took_direct(rid)
                return
            reason = f"{self._connection()} was lost: {type(exc).__name__}: {exc}"
            self.fail(reason if isinstance(exc, Exception) else
                      f"{self._connection()} was given up: {type(exc).__name__} interrupted a send on it")
            if not isinstance(exc, Exception):
                raise
            raise PeerDiedError(self._dead or reason, peer=self.host) from None
        if rid >= DIRECT_BASE:
            self._took_direct(rid)  # acknowledged: its producer may forget it, and send another

    def _write_acks(self, sock, data: bytes) -> None:
        """Write acknowledgements to the ack link's socket, whole (``TimeoutError`` past the send timeout)."""
        with self._ack_write_lock:  # the records of two threads must not interleave
            view, deadline = memoryview(data), None
            while True:
                view = view[_send_some(sock, view):]
                if not view:
                    return
                deadline = deadline or time.monotonic() + self._send_timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the host took no acknowledgement for {self._send_timeout:g} s")
                poller = select.poll()
                poller.register(sock, select.POLLOUT)
                poller.poll(max(1, int(min(left, 1.0) * 1000)))

    def _take_acks(self) -> list:
        acks = []
        while True:
            try:
                acks.append(self._acks.popleft())
            except IndexError:
                return acks

    def _offer_ack_link(self) -> None:
        """Open the ack link once the connection is fed ahead (the host confirms it), on a thread of its own
        (a handshake may take long; the reader that routed the feed, or the heartbeat, must not wait for it)."""
        if self._dial_acks is None or self._ack_offered is not None or not self._feeds:
            return
        with self._lock:
            dial, self._dial_acks = self._dial_acks, None  # one try per connection (two threads may look)
        if dial is None:
            return
        threading.Thread(target=self._dial_ack_link, args=(dial,), name=f"rlinf-channel-{self.channel}-acks",
                         daemon=True).start()

    def _dial_ack_link(self, dial: Callable) -> None:
        try:
            link = dial()
        except Exception:
            return  # acknowledgements keep going on the main connection
        sock = link.detach()  # nothing was read on it, nor will be: only writes go this way
        if sock is None:
            link.close()  # the host sees it end: acknowledgements keep going on the main connection
            return
        with self._lock:
            self._ack_offered, ready = sock, self._ack_confirmed
        if self._dead is not None:  # failed meanwhile: fail() closed what it saw, this one is ours to close
            self._close_ack_link()
        elif ready:
            self._ack_link = sock

    def _ack_link_confirmed(self) -> None:
        """The host reads the ack link from now on (routed from the main connection)."""
        with self._lock:
            self._ack_confirmed, link = True, self._ack_offered
        if link is not None and self._dead is None:
            self._ack_link = link

    def _close_ack_link(self) -> None:
        link, self._ack_link = self._ack_offered, None
        if link is not None:
            try:
                link.close()
            except Exception:
                pass

    def _say_more(self, key: str) -> None:
        """Before waiting for a fed item: if the host has not heard from us since our last quiet ack, it
        may hold the feed back with a window it thinks full; ``more`` makes it read the acks and refill."""
        if self._acked_quietly:
            self._send_one_way({"id": 0, "op": "more", "key": key})


def _send_some(sock, data) -> int:
    """Bytes of ``data`` a non-blocking socket took now (0 when its buffer is full)."""
    try:
        return sock.send(data)
    except BlockingIOError:
        return 0
