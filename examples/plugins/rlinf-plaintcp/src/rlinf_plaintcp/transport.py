"""Plain TCP: length-prefixed frames, and a reader thread per connection.

The reader thread drains the socket into a queue, so two processes that
send large messages to each other at the same time never block each other.
It reads ahead at most ``READ_AHEAD`` bytes: a peer that stops receiving
pushes back on its sender instead of growing without bound.  Every wait ends
by its deadline: a send waiting for another thread's send (``LinkBusy``),
a send the peer does not take (``TimeoutError``; a message cut off midway
ends the link, since the peer could not tell where the next one starts), and
a receive.

Every connection is authenticated before anything else happens on it: the
listener hands each accepted socket to ``rlinf.scheduler.base.security``'s
``HandshakeGate`` (the cluster-secret challenge both ways, a bounded hello,
a deadline, a bound on handshakes in flight) and only sees the connections
that passed; the connecting side runs ``client_handshake``, ``send_hello``
and ``await_accepted`` (the listener acknowledges a connection once it took
it, which keeps a sender's reconnections in order).
Copy this part as it is: a listener that skips it lets any process that can
reach the port send pickles to your workers.
"""

from __future__ import annotations

import collections
import select
import socket
import struct
import threading
import time
from typing import Optional

from rlinf.scheduler.base import security
from rlinf.scheduler.plugins.transport import READ_AHEAD_MESSAGE_COST, HeldWithin, Link, Transport

#: bytes of whole messages the reader thread takes from the socket before anyone asked for them
#: (each message also counts READ_AHEAD_MESSAGE_COST, so many empty ones are bounded too)
READ_AHEAD = 64 << 20
#: frames in one message, and bytes in one frame, that a peer may announce
MAX_FRAMES = 1 << 16
MAX_FRAME = 1 << 40
_HEAD = struct.Struct("<BI")  # raw flag, number of frames
_LEN = struct.Struct("<Q")


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    pos = 0
    while pos < n:
        got = sock.recv_into(view[pos:])
        if got == 0:
            raise ConnectionError("the peer closed the connection")
        pos += got
    return buf


class TcpLink(Link):
    def __init__(self, sock: socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)
        self._sock = sock
        self._send_lock = threading.RLock()  # one send at a time (HeldWithin)
        self._owed = b""  # what the peer must read before anything we send (the listener's acknowledgement)
        self._broken: Optional[str] = None  # why no message can be sent any more
        self._inbox: collections.deque = collections.deque()
        self._inbox_bytes = 0
        self._closed = False
        self._error: Optional[BaseException] = None
        self._cond = threading.Condition()
        threading.Thread(target=self._reader, name="plaintcp-reader", daemon=True).start()

    def _reader(self) -> None:
        try:
            while True:
                raw, count = _HEAD.unpack(_recv_exact(self._sock, _HEAD.size))
                if count > MAX_FRAMES:
                    raise ConnectionError(f"the peer announced {count} frames in one message")
                sizes = [_LEN.unpack(_recv_exact(self._sock, _LEN.size))[0] for _ in range(count)]
                if any(n > MAX_FRAME for n in sizes):
                    raise ConnectionError(f"the peer announced a frame of {max(sizes)} bytes")
                frames = [_recv_exact(self._sock, n) if n else bytearray() for n in sizes]
                cost = sum(sizes) + READ_AHEAD_MESSAGE_COST
                with self._cond:
                    self._inbox.append((bool(raw), frames, cost))
                    self._inbox_bytes += cost
                    self._cond.notify_all()
                    while self._inbox_bytes >= READ_AHEAD and not self._closed:
                        self._cond.wait(1.0)  # until a receive takes some (it notifies), or the link closes
        except BaseException as exc:
            with self._cond:
                self._error = exc if isinstance(exc, ConnectionError) else ConnectionError(str(exc))
                self._cond.notify_all()

    def send(self, frames, deadline, raw=False):
        views = [memoryview(f).cast("B") for f in frames]
        head = _HEAD.pack(1 if raw else 0, len(views)) + b"".join(_LEN.pack(v.nbytes) for v in views)
        sent = [0]
        # waits for another thread's send at most until our own deadline (LinkBusy)
        with HeldWithin(self._send_lock, deadline, "send"):
            try:
                if self._broken is not None:
                    raise ConnectionError(f"the link is broken: {self._broken}")
                self._pay_owed()
                self._send_all([memoryview(head), *(v for v in views if v.nbytes)], deadline, sent)
            except BaseException as exc:
                # cut off midway: the peer cannot find where a next message would start.  An interrupt
                # (Ctrl-C) counts as midway: it may land after the kernel took bytes, before they were counted
                if sent[0] or not isinstance(exc, Exception):
                    self._broken = f"a send failed midway ({type(exc).__name__})"
                    try:
                        self._sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                if isinstance(exc, OSError) and not isinstance(exc, (ConnectionError, TimeoutError)):
                    raise ConnectionError(f"sending failed: {exc}") from exc
                raise

    def _send_all(self, views, deadline, sent) -> None:
        """Send ``views`` whole, never blocking past ``deadline`` (``sent[0]`` counts the bytes that left)."""
        poller = None
        for view in views:
            while view.nbytes:
                try:
                    n = self._sock.send(view, socket.MSG_DONTWAIT)
                except BlockingIOError:  # the socket buffer is full: wait until the peer takes some
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        raise TimeoutError("the peer did not take the message before the deadline") from None
                    if poller is None:
                        poller = select.poll()
                        poller.register(self._sock, select.POLLOUT)
                    poller.poll(None if left is None else max(1, int(left * 1000)))
                    continue
                sent[0] += n
                view = view[n:]

    def owe(self, data: bytes) -> None:
        self._owed = data

    def settle(self) -> None:
        """Send what is owed, unless a send already did."""
        with HeldWithin(self._send_lock, None, "send"):
            try:
                self._pay_owed()
            except OSError:
                pass  # the peer left: its connect fails

    def _pay_owed(self) -> None:  # under _send_lock
        if self._owed:  # before any other byte, so never cut off midway
            self._sock.sendall(self._owed)  # one byte into an empty socket buffer: never blocks
            self._owed = b""

    def recv(self, deadline):
        with self._cond:
            while not self._inbox:
                if self._error is not None:
                    raise self._error
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError("no message before the deadline")
                self._cond.wait(left)
            raw, frames, size = self._inbox.popleft()
            self._inbox_bytes -= size
            self._cond.notify_all()  # the reader may be waiting for room
            return raw, frames

    def is_open(self):
        return self._broken is None and (self._error is None or bool(self._inbox))

    def recv_into(self, targets, deadline):
        raw, frames = self.recv(deadline)
        views = [memoryview(t).cast("B") for t in targets]
        if [len(f) for f in frames] != [v.nbytes for v in views]:
            raise ValueError(f"message of {[len(f) for f in frames]} bytes, buffers of {[v.nbytes for v in views]}")
        for v, f in zip(views, frames):
            v[:] = f
        return raw

    def close(self):
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        try:  # shutdown first: close() alone leaves the connection up while the reader thread is in recv
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass


class PlainTcpTransport(Transport):
    name = "plaintcp"

    def __init__(self):
        self._server: Optional[socket.socket] = None
        self._gate: Optional[security.HandshakeGate] = None
        self._links: list[TcpLink] = []
        self._lock = threading.Lock()

    def _keep(self, link: TcpLink) -> TcpLink:
        with self._lock:  # forget the links that ended, so a long-lived process does not pile them up
            self._links = [l for l in self._links if l.is_open()] + [link]
        return link

    def listen(self, on_accept, local_ip):
        def authenticated(conn, hello):  # only connections that proved they hold the cluster secret
            link = self._keep(TcpLink(conn))
            # the acknowledgement the connecting side waits for (security.await_accepted): sent once on_accept
            # has taken the link, and before anything else sent on it; it keeps a sender's reconnections in order
            link.owe(security.ACCEPTED)
            on_accept(link, hello)
            link.settle()

        self._gate = gate = security.HandshakeGate(authenticated, name="plaintcp")
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.bind((local_ip, 0))  # the OS picks the port: no race with other processes
        server.listen(64)
        self._server = server

        def accept_loop():
            while True:
                try:
                    conn, _ = server.accept()
                except OSError:
                    return
                gate.admit(conn)  # authenticates on a thread of its own, a bounded number at once

        threading.Thread(target=accept_loop, name="plaintcp-accept", daemon=True).start()
        # the gate's id goes into the endpoint: connecting sides bind their handshake to it
        return {"host": local_ip, "port": server.getsockname()[1], "listener": gate.listener_id}

    def connect(self, endpoint, hello, deadline):
        left = None if deadline is None else max(0.001, deadline - time.monotonic())
        sock = socket.create_connection((endpoint["host"], endpoint["port"]), timeout=left)
        try:
            limit = security.handshake_deadline(deadline)
            security.client_handshake(sock, limit, listener=endpoint["listener"])
            security.send_hello(sock, hello, limit)
            security.await_accepted(sock, limit)  # before the link's reader thread owns the socket
        except BaseException:
            sock.close()
            raise
        return self._keep(TcpLink(sock))

    def probe(self, endpoint):
        try:
            socket.create_connection((endpoint["host"], endpoint["port"]), timeout=2).close()
            return True
        except ConnectionRefusedError:
            return False
        except OSError:
            return True

    def close(self):
        if self._server is not None:
            self._server.close()
        if self._gate is not None:
            self._gate.close()
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()
