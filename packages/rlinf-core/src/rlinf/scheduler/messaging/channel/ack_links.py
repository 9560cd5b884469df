"""The host side of ack links (a part of ``server.ChannelServer``; the client side is ``acking``).

A fed client acknowledges on a second connection whose hello names its main
connection's token; the host pairs the two, confirms on the main connection,
and from then on reads the second one without ever waiting on it: only when
bytes came (a ``poll`` of its descriptor), before each message of that
client, when one of its feeds' windows looks full, on each connection check,
for ``qsize``, and to its end when the client goes.
"""

from __future__ import annotations

import select
import struct

from ...plugins.transport import Link
from .queues import _Conn

#: messages of a client's ack link read at once (a client sends one per item it hands out)
_ACK_DRAIN = 1 << 16


class _AckLinks:
    """Pairing and reading ack links (uses the server's connections and ``_acked``)."""

    def _attach_acks(self, link: Link, token: str) -> None:
        """A client's ack link (see ``acking``): read without waiting, and confirmed on its main connection."""
        conn = self._tokens.get(token)
        if conn is None or not conn.alive or conn.ack_link is not None or conn.fd is None or link.poll_fd() is None:
            link.close()
            return
        conn.ack_link, conn.ack_poll = link, select.poll()
        conn.ack_poll.register(link.poll_fd(), select.POLLIN)
        self._reply(conn, {"id": 0, "op": "acks"})

    def _drain_acks(self, conn: _Conn, progress: bool = True) -> None:
        """Apply the acknowledgements waiting on ``conn``'s ack link (all of them: it is never waited on)."""
        link, ids = conn.ack_link, []
        if link is None or not (conn.ack_left or conn.ack_poll.poll(0)):
            return  # nothing came since the last read (a whole message left read ahead is not: ack_left)
        conn.ack_left = True
        for _ in range(_ACK_DRAIN):  # bounded: a client that floods it waits its turn
            try:
                msg = link.recv_nowait()
                if msg is None:
                    conn.ack_left = False
                    break
                ids.extend(struct.unpack(f"<{len(msg[1][0]) // 8}q", msg[1][0]))  # item ids, int64 each
                if len(ids) >= _ACK_DRAIN:
                    break
            except Exception:  # closed (the client went: everything it sent has been read) or garbled
                conn.ack_link = None
                link.close()
                break
        if ids:
            self._acked(conn, ids, progress)

