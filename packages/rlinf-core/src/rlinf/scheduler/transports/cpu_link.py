"""``SocketLink``: the CPU transport's link, one connected stream socket, with shared memory on one host.

The class holds the link's state, its waiting (spin, then sleep in ``poll``)
and its closing; its sending (``cpu_link_send``), receiving
(``cpu_link_receive``) and read-ahead (``cpu_read_ahead``) come from the
classes it is made of, over the wire format of ``cpu_wire``.
"""

from __future__ import annotations

import collections
import os
import select
import socket
import threading
import time
from typing import Callable, Optional

from ..plugins.transport import Link, LinkClosed
from .cpu_link_receive import _Receiving
from .cpu_link_send import SEND_NOW_MAX, _Sending
from .cpu_read_ahead import _reader, _ReadAhead
from .cpu_wire import _MAX_FDS, _Partial, _remaining

#: buffers at least this large go through shared memory (same host only)
SHM_MIN_ENV = "RLINF_CPU_SHM_MIN_BYTES"
#: microseconds a receive spins before sleeping (0: never spin)
SPIN_ENV = "RLINF_SPIN_US"
#: TCP keepalive: probe an idle peer after this many seconds, then every interval, giving up after count
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 15, 5, 4


def _spin_seconds() -> float:
    return max(0.0, float(os.environ.get(SPIN_ENV, "50"))) / 1e6


def _keepalive(sock: socket.socket) -> None:
    """Let the kernel notice a peer host that vanished (no FIN ever comes) within about a minute."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                           ("TCP_KEEPCNT", KEEPALIVE_COUNT)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    except OSError:
        pass


class SocketLink(_Sending, _Receiving, _ReadAhead, Link):
    """One connected stream socket; shared memory when ``local``.

    The socket is non-blocking: a ready socket costs one system call, a
    waiting one spins for at most ``RLINF_SPIN_US`` microseconds (a reply
    often arrives within that, which saves a sleep and a wake-up) and then
    sleeps in ``poll`` until the deadline.

    Failure semantics (what core relies on):

    * A send whose deadline passes before any byte of the message left keeps
      the link usable.  A send that fails midway shuts the socket down for
      writing, so the receiver reads every earlier message, then an end of
      stream that tells it to discard the torn one.
    * A receive whose deadline passes, mid-message or not, keeps what it read
      for the next receive.  Its deadline bounds the call even while bytes keep
      arriving (checked after each read), so a long message under short
      deadlines arrives over several receives.
    * A receive raises ``EOFError``-flavoured ``ConnectionError``
      (``LinkClosed``) only once every complete message the peer sent has
      been delivered.
    """

    def __init__(self, sock: socket.socket, local: bool):
        self.sock = sock
        self.local = local
        sock.setblocking(False)
        if not local:
            _keepalive(sock)
        self._fd = sock.fileno()
        self._poll_in = select.poll()
        self._poll_in.register(self._fd, select.POLLIN)
        self._poll_out = select.poll()
        self._poll_out.register(self._fd, select.POLLOUT)
        self._spin = _spin_seconds()
        self._reads_bounded = True  # a receive's deadline ends it between reads too (off in recv_nowait)
        self._shm_min = int(os.environ.get(SHM_MIN_ENV, str(1 << 16)))
        self._pool = self._cache = None
        if local:  # numpy and the segment code load only where shared memory is used
            from .shm import ReceiverCache, SenderPool

            self._pool, self._cache = SenderPool(), ReceiverCache()
        self._ancsize = socket.CMSG_SPACE(_MAX_FDS * 4) if local else 0
        self._send_now_max = min(SEND_NOW_MAX, sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 4) if local else 0
        self._rbuf = bytearray()  # grown on the first receive: a link that only sends never pays for it
        self._rview = memoryview(self._rbuf)
        self._rstart = 0
        self._rend = 0
        self._received = False  # any byte yet: see _fill on resets
        self._fds: list[int] = []
        self._partial: Optional[_Partial] = None
        self._wbroken: Optional[str] = None  # why no more messages can be sent
        self._rbroken: Optional[str] = None  # why no more messages can be received
        self._wlock = threading.RLock()  # send_now holds it around send
        self._moved_at = 0.0  # when bytes last moved either way (see last_progress)
        self._outq = 0  # bytes sent the peer had not taken, when last_progress last looked
        self._rlock = threading.Lock()
        self._ahead_cond: Optional[threading.Condition] = None
        self._ahead_error: Optional[BaseException] = None
        self._ahead: "collections.deque" = collections.deque()
        self._on_close: list[Callable[["SocketLink"], None]] = []
        self._owed: Optional[bytes] = None  # bytes the peer must read before anything we send (see owe)

    def is_open(self) -> bool:
        return self._wbroken is None and self._rbroken is None

    # -- waiting ------------------------------------------------------------------
    def _wait(self, poller, deadline: Optional[float], spun: list) -> None:
        """Called after EAGAIN: spin once per operation, then sleep in poll until the deadline."""
        if not spun[0]:
            spun[0] = True
            if self._spin:
                end = time.perf_counter() + self._spin
                while time.perf_counter() < end:
                    if poller.poll(0):
                        return
        left = _remaining(deadline)
        # sleep in slices of at most a second, so a link closed under us is noticed
        if not poller.poll(1000 if left is None else max(1, int(min(left, 1.0) * 1000))):
            if self.sock.fileno() < 0:
                raise ConnectionError("the link was closed")
            _remaining(deadline)  # raises once past the deadline

    def detach(self) -> Optional[socket.socket]:
        """See ``Link.detach``: not for a link read by a read-ahead thread, nor one with bytes or
        descriptors read past the last message; waits for another thread's send (a second at most).
        Its caller has no send of its own under way on the link (a send copies into shared memory
        before it takes the lock detach waits on, and that memory goes here)."""
        if self._ahead_cond is not None or not self._rlock.acquire(timeout=1.0):
            return None
        try:
            if self._rend > self._rstart or self._partial is not None or self._fds or not self.is_open():
                return None
            if not self._wlock.acquire(timeout=1.0):
                return None
            try:
                if self._owed is not None:
                    self._pay_owed(time.monotonic() + 1.0)  # one byte, sent whole or not at all
                self._wbroken = self._rbroken = "detached (its socket is used directly)"
            except (OSError, TimeoutError):
                return None
            finally:
                self._wlock.release()
        finally:
            self._rlock.release()
        if self._pool is not None:  # its shared memory goes now (a detached link never sends again)
            self._pool.close()
        if self._cache is not None:
            self._cache.close()
        callbacks, self._on_close = self._on_close, []
        for fn in callbacks:  # the transport forgets it: its close no longer closes this socket
            fn(self)
        return self.sock

    def add_close_callback(self, fn: Callable[["SocketLink"], None]) -> None:
        """Call ``fn(link)`` once when the link is closed (the transport forgets it then)."""
        self._on_close.append(fn)

    def close(self) -> None:
        self._wbroken = self._wbroken or "closed"
        self._rbroken = self._rbroken or "closed"
        if self._ahead_cond is not None:
            _reader().remove(self)  # before the descriptor is closed (and its number reused)
        try:
            self.sock.close()
        except OSError:
            pass
        if self._ahead_cond is not None:
            with self._ahead_cond:
                if self._ahead_error is None:  # ends a receive waiting on it, once what was read is taken
                    self._ahead_error = LinkClosed("the connection is unusable: closed")
                self._ahead_cond.notify_all()
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)
        if self._ahead_cond is None and self._rlock.acquire(blocking=False):
            try:  # no reader: the receive buffer goes now, not whenever the link object does
                self._rbuf = bytearray()
                self._rview = memoryview(self._rbuf)
                self._rstart = self._rend = 0
            finally:
                self._rlock.release()
        if self._pool is not None:
            self._pool.close()
        if self._cache is not None:
            self._cache.close()
        callbacks, self._on_close = self._on_close, []
        for fn in callbacks:
            fn(self)
