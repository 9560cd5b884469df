"""The sending side of the CPU transport's ``SocketLink``: framing and sending whole messages.

A message is framed (``cpu_wire``) with its large buffers copied into a
shared-memory segment on a same-host link, and sent whole after whatever the
link owes the peer, one send at a time (``LinkBusy`` past the deadline).  A
send that fails midway ends the stream so the receiver drops the torn message.
"""

from __future__ import annotations

import array
import fcntl
import socket
import struct
import termios
import time
from typing import Optional, Sequence

from ..plugins.transport import LinkBusy
from .cpu_wire import _ALIGN, _DROP, _FRAME, _NEWSEG, INLINE, SHM, _message_head

#: the largest message ``SocketLink.send_now`` sends (a quarter of the smallest default Unix socket buffer)
SEND_NOW_MAX = 32 << 10


class _Sending:
    """``SocketLink``'s sends: its state lives in ``SocketLink.__init__``."""

    def owe(self, data: bytes) -> None:
        """``data`` goes out first: with the next send, or by ``settle``, whichever comes first."""
        self._owed = data

    def settle(self, deadline: Optional[float]) -> None:
        """Send what is owed now, if no send did yet; a failure shows as the link's end to the peer."""
        try:
            self._send_message([], [], deadline)  # an empty message: what is owed goes first
        except (OSError, TimeoutError):  # LinkBusy included: that send pays what is owed first
            pass

    def _pay_owed(self, deadline: Optional[float]) -> None:  # under _wlock
        owed = self._owed
        if owed:
            self._send_all([owed], [], deadline, [0])  # one byte: sent whole or not at all
        self._owed = None

    def send(self, frames: Sequence, deadline: Optional[float], raw: bool = False) -> None:
        if self._wbroken is not None:
            raise ConnectionError(f"the connection is unusable: {self._wbroken}")
        views = []
        for f in frames:
            v = f if isinstance(f, memoryview) else memoryview(f)
            if v.ndim != 1 or v.format != "B":
                v = v.cast("B")
            views.append(v)
        descs, inline, fds, newsegs, drops = [], [], [], [], []
        shm_min = self._shm_min
        seg = created = None
        if self.local and any(v.nbytes >= shm_min for v in views):
            total = sum(-(-v.nbytes // _ALIGN) * _ALIGN for v in views if v.nbytes >= shm_min)
            got = self._pool.acquire(total)
            if got is not None:  # else the receiver holds too much of ours: inline, never wait
                seg, created = got
                if created:
                    newsegs.append(_NEWSEG.pack(seg.seg_id, seg.capacity))
                    fds.append(seg.fd)
                drops = [_DROP.pack(i) for i in self._pool.take_dropped()]
        unsent = None if seg is None else lambda: self._pool.unsent(seg, created, [_DROP.unpack(d)[0] for d in drops])
        offset = 0
        if seg is not None:
            import numpy as np

            from .shm import DATA_OFFSET, parallel_copy
        try:
            for v in views:
                n = v.nbytes
                if seg is not None and n >= shm_min:
                    parallel_copy(seg.view[DATA_OFFSET + offset : DATA_OFFSET + offset + n], np.frombuffer(v, dtype=np.uint8))
                    descs.append(_FRAME.pack(SHM, seg.seg_id, offset, n))
                    offset += -(-n // _ALIGN) * _ALIGN
                else:
                    descs.append(_FRAME.pack(INLINE, 0, 0, n))
                    if n:
                        inline.append(v)
        except BaseException:  # an interrupt during the copy: the segment goes back
            if unsent is not None:
                unsent()
            raise
        header = _message_head(raw, descs, newsegs, drops)
        self._send_message([header, *inline], fds, deadline, unsent)
        if fds:
            self._pool.sent(seg)

    def _send_message(self, pending: list, fds: list, deadline: Optional[float], unsent=None) -> None:
        """Send one message whole, after what is owed and after any other thread's send, waiting
        for that at most until ``deadline`` (``LinkBusy`` then).  ``unsent()`` is called if it
        fails with nothing of it sent.  A message that fails midway ends the stream here, so the
        receiver drops it and keeps the rest; so does an interrupt (``KeyboardInterrupt``) once
        the lock is held, as it may land after the kernel took bytes and before they were counted.

        The lock is taken and released without a gap where an interrupt could keep it held, or
        release a hold this thread had before (``send_now`` around ``send``), and with no object
        made per message (this is every message's path)."""
        lock = self._wlock
        held_before = lock._is_owned()
        got = False
        progress = [0]
        try:
            # deadline None: the caller asked to wait without limit, here as in the send itself; the
            # holder's send ends by its own deadline, or when the link fails
            got = lock.acquire(False) or (
                lock.acquire() if deadline is None else lock.acquire(timeout=max(0.0, deadline - time.monotonic())))
            if not got:
                raise LinkBusy("another send on this connection held it until the deadline")
            if self._owed is not None:
                self._pay_owed(deadline)
            self._send_all(pending, fds, deadline, progress)
        except BaseException as exc:
            if progress[0] or (got and not isinstance(exc, Exception)):
                self._wbroken = f"a send failed midway ({type(exc).__name__})"
                try:
                    self.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
            elif unsent is not None:
                unsent()
            raise
        finally:
            if got or (not held_before and lock._is_owned()):  # taken, though an interrupt came before `got` was set
                lock.release()

    def last_progress(self) -> float:
        """``Link.last_progress``: set when bytes are read, when a send that found the buffers full
        goes on, and when fewer of our bytes wait for the peer than when this last looked (the
        kernel's count, ``SIOCOUTQ``: the peer took some, though the sender may not yet be woken).
        Meant to be called now and then (a heartbeat): each call is one ``ioctl``."""
        try:
            queued = struct.unpack("i", fcntl.ioctl(self._fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        except OSError:  # closed
            return self._moved_at
        if queued < self._outq:
            self._moved_at = max(self._moved_at, time.monotonic())
        self._outq = queued
        return self._moved_at

    def send_now(self, frames: Sequence) -> bool:
        """``Link.send_now``: on a Unix socket, a message of at most ``SEND_NOW_MAX`` bytes (and a
        quarter of the socket's send buffer) while the socket polls writable.  The kernel reports a
        Unix stream socket writable only while at most a quarter of its send buffer is queued at the
        peer, so such a message is taken whole by one ``sendmsg`` (Linux's rule; where it does not
        hold, a partial send waits up to a second, then breaks the link).  Never on TCP, where
        writable promises only some room (a part sent would have to wait for the rest)."""
        if not self.local or self._wbroken is not None:
            return False
        total = 0
        for f in frames:
            total += f.nbytes if isinstance(f, memoryview) else memoryview(f).nbytes
        if total > self._send_now_max or total >= self._shm_min:
            return False
        if not self._wlock.acquire(blocking=False):
            return False  # another send is under way: it may be waiting
        try:
            if not self._poll_out.poll(0):
                return False
            self.send(frames, time.monotonic() + 1.0)  # cannot wait (see above): the deadline only bounds a surprise
            return True
        finally:
            self._wlock.release()

    def send_fds(self, inline: Sequence, fds: Sequence[int], deadline: Optional[float]) -> None:
        """Send ``inline`` frames with descriptors riding along (``SCM_RIGHTS``); the caller keeps its own.

        The receiver collects them with ``take_fds`` after receiving the
        message.  ``broadcast`` hands one shared-memory segment, written once,
        to several receivers this way.  Same-host links only.
        """
        if not self.local:
            raise ValueError("descriptors travel over same-host links only")
        if self._wbroken is not None:
            raise ConnectionError(f"the connection is unusable: {self._wbroken}")
        views = [memoryview(f).cast("B") for f in inline]
        descs = [_FRAME.pack(INLINE, 0, 0, v.nbytes) for v in views]
        header = _message_head(False, descs)
        self._send_message([header, *[v for v in views if v.nbytes]], list(fds), deadline)

    def _send_all(self, pending: list, fds: list[int], deadline: Optional[float], progress: list) -> None:
        sock = self.sock
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        spun = [False]
        waited = False
        while pending:
            try:
                sent = sock.sendmsg(pending[:512], anc)
            except (BlockingIOError, InterruptedError):
                self._wait(self._poll_out, deadline, spun)
                waited = True
                continue
            anc = []
            progress[0] += sent
            if waited:  # the buffers were full and the peer made room: it reads (bytes merely queued prove nothing)
                self._moved_at = time.monotonic()
            while sent and pending:
                head = pending[0]
                size = memoryview(head).nbytes
                if sent >= size:
                    sent -= size
                    pending.pop(0)
                else:
                    pending[0] = memoryview(head).cast("B")[sent:]
                    sent = 0
