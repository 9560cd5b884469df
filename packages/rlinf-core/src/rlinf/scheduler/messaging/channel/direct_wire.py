"""The bytes on a direct route's link (see ``routes``): its socket, taken over from the authenticated link.

Producer to consumer, one message per item: a head (``HEAD``: the bytes
after it, the item's number on the route, its weight, its frame count), the
frames' lengths (uint32 each), then the frames.  Consumer to producer: bare
8-byte credits (``CREDIT``: items taken so far, and the same number's bitwise
complement, so a record read out of step is never taken for a credit).  A framed link cost about
twice as much per item in Python; these are one ``sendmsg`` and one parse.
A message cut short (its sender failed midway) is dropped with the link's
end, so an item either arrives whole or not at all.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from typing import Optional

HEAD = struct.Struct("<IIdI")  # bytes after the head, item number, weight, frame count
CREDIT = struct.Struct("<II")  # items taken, and its complement
_ALL = 0xFFFFFFFF


def pack_credit(taken: int) -> bytes:
    return CREDIT.pack(taken, taken ^ _ALL)
#: the largest message a consumer takes on a route (an item there is smaller than a push's limit)
MESSAGE_MAX = 1 << 17
FRAMES_MAX = 4096


def send_item(sock: socket.socket, n: int, weight: float, frames, deadline: float) -> None:
    """Write one item whole; ``TimeoutError`` if nothing of it went by ``deadline`` (the socket is left as
    it was), ``ConnectionError`` if it was cut short (the socket is shut down: the consumer drops the part)."""
    sizes = [len(f) if type(f) is bytes else memoryview(f).nbytes for f in frames]
    body = 4 * len(sizes) + sum(sizes)
    parts = [struct.pack(f"<IIdI{len(sizes)}I", body, n, weight, len(sizes), *sizes), *frames]
    left_bytes = HEAD.size + body
    went = 0  # bytes of this item sent so far
    while True:
        try:
            sent = sock.sendmsg(parts)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            shut(sock)
            raise ConnectionError(f"the route's link failed: {exc}") from None
        except BaseException:  # interrupted: a part may have gone, so nothing more goes on this socket
            shut(sock)
            raise
        went += sent
        left_bytes -= sent
        if not left_bytes:
            return
        parts = _rest(parts, sent)
        left = deadline - time.monotonic()
        if left <= 0 or not ready(sock, select.POLLOUT, left):
            if not went:
                raise TimeoutError("the route's link took nothing")
            shut(sock)
            raise ConnectionError("the route's link took an item only in part")


def _rest(parts: list, sent: int) -> list:
    out = []
    for p in parts:
        view = memoryview(p).cast("B")
        if sent >= view.nbytes:
            sent -= view.nbytes
            continue
        out.append(view[sent:])
        sent = 0
    return out


def shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass


class Reader:
    """Parses the messages that arrive on a route's socket (consumer side)."""

    __slots__ = ("sock", "buf")

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = bytearray()

    def read(self, limit: int) -> tuple[list, bool]:
        """The whole items that came, at most ``limit``: ``[(n, weight, frames)]``, and whether the link
        ended (closed, or a message no route could send: the caller drops the link)."""
        ended = False
        try:
            while len(self.buf) < HEAD.size * limit + MESSAGE_MAX:
                got = self.sock.recv(1 << 16)
                if not got:
                    ended = True
                    break
                self.buf += got
                if len(got) < 1 << 16:
                    break
        except BlockingIOError:
            pass
        except OSError:
            ended = True
        items, pos, buf = [], 0, self.buf
        while len(items) < limit and len(buf) - pos >= HEAD.size:
            size, n, weight, count = HEAD.unpack_from(buf, pos)
            if size > MESSAGE_MAX or not 0 < count <= FRAMES_MAX or 4 * count > size:
                return items, True
            if len(buf) - pos - HEAD.size < size:
                break
            body = bytes(buf[pos + HEAD.size:pos + HEAD.size + size])
            lengths = struct.unpack_from(f"<{count}I", body)
            if sum(lengths) + 4 * count != size:
                return items, True
            view, at, frames = memoryview(body), 4 * count, []
            for length in lengths:
                frames.append(view[at:at + length])
                at += length
            items.append((n, weight, frames))
            pos += HEAD.size + size
        del buf[:pos]
        return items, ended


def read_credit(sock: socket.socket, rest: bytes) -> tuple[Optional[int], bytes]:
    """The latest credit that came (None if none), and the start of a record cut by the read.

    ``ValueError`` if a record is not a credit (the stream is out of step: an interrupt dropped bytes
    read from it, or something else wrote to it); the caller trusts no credit of that link from then on."""
    try:
        data = rest + sock.recv(1 << 12)
    except (BlockingIOError, InterruptedError):
        return None, rest
    except OSError:
        return None, b""
    whole = len(data) - len(data) % CREDIT.size
    latest = None
    for taken, check in CREDIT.iter_unpack(data[:whole]):
        if check != taken ^ _ALL:
            raise ValueError("a route's link carried a record that is not a credit")
        latest = taken
    return latest, data[whole:]


def ready(sock: socket.socket, event: int, seconds: float) -> bool:
    """Whether ``sock`` is ready for ``event`` (``select.POLLIN``: bytes or its end; ``POLLOUT``: room)
    within ``seconds``; False if it is closed here (the connection failed meanwhile)."""
    try:
        poller = select.poll()
        poller.register(sock, event)
    except (ValueError, OSError):
        return False
    return bool(poller.poll(max(1, int(seconds * 1000))))
