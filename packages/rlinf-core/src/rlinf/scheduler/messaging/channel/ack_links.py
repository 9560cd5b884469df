"""The host side of ack links (a part of ``server.ChannelServer``; the client side is ``acking``).

A fed client acknowledges on a second connection whose hello names its main
connection's token; the host pairs the two, takes the second one's socket
over (``Link.detach``: from then on it carries bare int64 item ids, see
``acking``), confirms on the main connection, and reads the socket without
ever waiting on it: only when bytes came (a ``poll`` of it), before each
message of that client, when one of its feeds' windows looks full, on each
connection check, for ``qsize``, and to its end when the client goes.
"""

from __future__ import annotations

import select
import struct

from ...plugins.transport import Link
from .protocol import DIRECT_BASE
from .queues import _Conn

#: bytes of a client's ack link read at once (8 per item it hands out), and reads of it in one drain
_ACK_CHUNK, _ACK_READS = 1 << 16, 16


class _AckLinks:
    """Pairing and reading ack links, and applying acknowledgements (uses the server's connections and queues)."""

    def _attach_acks(self, link: Link, token: str) -> None:
        """A client's ack link (see ``acking``): read without waiting, and confirmed on its main connection."""
        conn = self._tokens.get(token)
        if conn is None or not conn.alive or conn.ack_link is not None or conn.fd is None or link.poll_fd() is None:
            link.close()
            return
        sock = link.detach()
        if sock is None:  # the link would not hand its socket over: acks stay on the main connection
            link.close()
            return
        conn.ack_link, conn.ack_poll, conn.ack_rest = sock, select.poll(), b""
        conn.ack_poll.register(sock, select.POLLIN)
        self._reply(conn, {"id": 0, "op": "acks"})

    def _drain_acks(self, conn: _Conn, progress: bool = True, reads: int = 0) -> None:
        """Apply the acknowledgements waiting on ``conn``'s ack link (all of them: it is never waited on);
        ``reads``: at most that many reads (``_ACK_READS`` by default; a departed client's, to its end)."""
        sock = conn.ack_link
        if sock is None or not (conn.ack_left or conn.ack_poll.poll(0)):
            return  # nothing came since the last read (a full read may have left more: ack_left)
        data = conn.ack_rest  # a record split between two reads is completed by the next
        conn.ack_left = True
        for _ in range(reads or _ACK_READS):  # bounded: a client that floods it waits its turn
            try:
                got = sock.recv(_ACK_CHUNK)
            except BlockingIOError:
                conn.ack_left = False
                break
            except OSError:
                got = b""
            if not got:  # closed (the client went: everything it sent has been read)
                conn.ack_link = None
                sock.close()
                break
            data += got
            if len(got) < _ACK_CHUNK:
                conn.ack_left = False
                break
        whole = len(data) - len(data) % 8
        conn.ack_rest = data[whole:]
        if whole:
            self._acked(conn, struct.unpack(f"<{whole // 8}q", data[:whole]), progress)

    def _acked(self, conn: _Conn, ids, progress: bool = True) -> None:
        """Forget the items of these replies, fed items and direct items (see ``routes``): their client
        handed them to its user."""
        fed: set = set()
        for i in ids:
            if i >= DIRECT_BASE:
                key = self._acked_direct(conn, i)
                if key is not None:
                    fed.add(key)
                continue
            entry = conn.inflight.pop(i, None)
            if entry is not None:
                for item in entry[1]:
                    self._blocks.give_back(item[0])
                if i < 0 and self._unfeed(conn, i) is not None:
                    fed.add(entry[0])
        if not progress:  # the caller is in the middle of something: the loop serves these keys after it
            self._feed_later.update(fed)
            return
        for key in fed:
            q = self._queues.get(key)
            # its window has room again, or the last item of a recalled feed is settled: gets held for it go on
            if q is not None and (q.feed is not None or (not q.fed and q.getters)):
                self._progress(key)
