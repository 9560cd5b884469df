"""The receiving side of the CPU transport's ``SocketLink``: reading, parsing and resuming messages.

A receive reads into the link's buffer, parses a message's head only once all
of it has arrived, and reads inline frames straight into buffers of their own
(or the caller's, for ``recv_into``); shared-memory frames are views of (or
copies out of) the sender's segments.  A receive whose deadline passes midway
keeps what it read (``_Partial``) and the next one resumes there.
"""

from __future__ import annotations

import array
import socket
import time
from typing import Optional, Sequence

from ..plugins.transport import LinkClosed
from .cpu_wire import (
    _CHUNK,
    _DROP,
    _FRAME,
    _HEADER,
    _NEWSEG,
    FLAG_RAW,
    KIND_DATA,
    SHM,
    _fill_targets,
    _Partial,
    _receive_buffer,
)


class _Receiving:
    """``SocketLink``'s receives: its state lives in ``SocketLink.__init__``."""

    def peer_closed(self) -> bool:
        """True once the peer closed the connection and nothing it sent is left to receive.

        Never blocks and never consumes data; ``False`` while a receive is
        under way on another thread.
        """
        if self._ahead_cond is not None:
            with self._ahead_cond:
                return self._ahead_error is not None and not self._ahead
        if self._rbroken is not None:
            return True
        if self._partial is not None or self._rend != self._rstart:
            return False
        if not self._rlock.acquire(blocking=False):
            return False
        try:
            if not self._poll_in.poll(0):
                return False
            try:
                return self.sock.recv(1, socket.MSG_PEEK) == b""
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                return True
        finally:
            self._rlock.release()

    def _closed(self, midway: bool):
        self._rbroken = "the peer closed the connection"
        if midway:
            raise LinkClosed("the peer closed the connection mid-message (its process may have died, "
                             "or its send failed midway)")
        raise LinkClosed("the peer closed the connection (its process may have died)")

    def _reset_is_end(self) -> bool:
        """Whether a connection reset ends the stream like a close, with nothing lost.

        On a Unix socket every byte sent is already queued here, and read before
        the reset is reported.  On TCP only while no byte came: a sender that gave
        up on a connection the listener took late closes it, with the
        acknowledgement unread, before sending one, and that resets it; once
        bytes came, a reset may have discarded some the sender's kernel still
        held, which is an error."""
        return self.local or not self._received

    def _recv_some(self, view: memoryview, deadline: Optional[float], spun: list, with_fds: bool) -> int:
        """One read into ``view``, waiting (``_wait``) while nothing has come; 0 once the stream ended
        (a reset included, where ``_reset_is_end``).  ``with_fds``: descriptors riding along are kept."""
        while True:
            try:
                if not with_fds:
                    return self.sock.recv_into(view)
                n, anc, _flags, _ = self.sock.recvmsg_into([view], self._ancsize)
                for level, kind, data in anc:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds = array.array("i")
                        fds.frombytes(data[: len(data) - len(data) % 4])
                        self._fds.extend(fds)
                return n
            except (BlockingIOError, InterruptedError):
                self._wait(self._poll_in, deadline, spun)
            except ConnectionResetError:
                if not self._reset_is_end():
                    raise
                return 0

    def _fill(self, deadline: Optional[float]) -> None:
        """Read more bytes into the buffer (compacting it first)."""
        if self._rstart:
            n = self._rend - self._rstart
            self._rbuf[:n] = self._rbuf[self._rstart : self._rend]
            self._rstart, self._rend = 0, n
        if self._rend == len(self._rbuf):  # grow into a new buffer: views of the old one stay valid
            bigger = bytearray(max(_CHUNK, 2 * len(self._rbuf)))
            bigger[: self._rend] = self._rbuf[: self._rend]
            self._rbuf, self._rview = bigger, memoryview(bigger)
        n = self._recv_some(self._rview[self._rend :], deadline, [False], with_fds=self.local)
        if n == 0:
            self._closed(self._rend != self._rstart)
        self._received = True
        self._rend += n
        self._moved_at = time.monotonic()

    def _ensure(self, n: int, deadline: Optional[float]) -> None:
        """Buffer at least ``n`` unread bytes; consumes nothing, so a timeout loses nothing."""
        while self._rend - self._rstart < n:
            self._fill(deadline)

    def _read_into(self, target: memoryview, pos: int, deadline: Optional[float], progress: list) -> None:
        """Fill ``target[pos:]``; ``progress[0]`` tracks how far it got, also when it raises."""
        have = min(self._rend - self._rstart, target.nbytes - pos)
        if have:
            target[pos : pos + have] = self._rview[self._rstart : self._rstart + have]
            self._rstart += have
            pos += have
            progress[0] = pos
        spun = [False]
        while pos < target.nbytes:
            n = self._recv_some(target[pos:], deadline, spun, with_fds=False)
            if n == 0:
                self._closed(True)
            pos += n
            progress[0] = pos
            self._moved_at = now = time.monotonic()
            if deadline is not None and now >= deadline and pos < target.nbytes and self._reads_bounded:
                # the deadline bounds the call, also while bytes keep coming: a receiver
                # slower than its sender finds data at every read and never waits
                raise TimeoutError("deadline passed")

    def _read_head(self, deadline: Optional[float]) -> _Partial:
        """Parse the next message's head, consuming it only once all of it has arrived."""
        if self._rbroken is not None:
            raise LinkClosed(f"the connection is unusable: {self._rbroken}")
        self._ensure(_HEADER.size, deadline)
        kind, flags, nframes, nnew, ndrop = _HEADER.unpack_from(self._rbuf, self._rstart)
        if kind != KIND_DATA:
            self._rbroken = f"unexpected message kind {kind}"
            raise ConnectionError(self._rbroken)
        size = _HEADER.size + nnew * _NEWSEG.size + ndrop * _DROP.size + nframes * _FRAME.size
        self._ensure(size, deadline)
        pos = self._rstart + _HEADER.size
        self._rstart += size
        body = self._rbuf
        for _ in range(nnew):
            seg_id, capacity = _NEWSEG.unpack_from(body, pos)
            pos += _NEWSEG.size
            if not self._fds:
                self._rbroken = "a shared-memory segment arrived without its descriptor"
                raise ConnectionError(self._rbroken)
            try:
                self._cache.add(seg_id, self._fds.pop(0), capacity)
            except (OSError, ValueError) as exc:  # a lying sender: refused like any bad frame
                self._rbroken = str(exc)
                raise ConnectionError(self._rbroken) from None
        for _ in range(ndrop):
            self._cache.drop(_DROP.unpack_from(body, pos)[0])
            pos += _DROP.size
        frames = [_FRAME.unpack_from(body, pos + i * _FRAME.size) for i in range(nframes)]
        return _Partial(bool(flags & FLAG_RAW), frames)

    def _finish(self, msg: _Partial, deadline: Optional[float]) -> tuple[bool, list]:
        """Read the rest of ``msg`` into buffers of its own; on a timeout or an interrupt (Ctrl-C in the
        reading thread) ``msg`` is kept to resume, so the next receive does not read its body as a header."""
        frames, out = msg.frames, msg.out
        try:
            while msg.index < len(frames):
                where, seg_id, off, n = frames[msg.index]
                if where == SHM:
                    if msg.shm is None:  # one view for all frames: the segment is FREE once all are gone
                        end = max(o + m for w, _s, o, m in frames if w == SHM)
                        msg.shm = self._cache.view(seg_id, 0, end)
                    out.append(msg.shm[off : off + n])
                elif len(out) == msg.index and n <= self._rend - self._rstart:  # already buffered: one copy
                    out.append(bytearray(self._rview[self._rstart : self._rstart + n]))
                    self._rstart += n
                else:
                    # a buffer per frame, made once: a receive that timed out before the frame's first
                    # byte made it already (pos 0 does not say whether one exists)
                    if len(out) == msg.index:
                        out.append(_receive_buffer(n))
                    progress = [msg.pos]
                    try:
                        self._read_into(memoryview(out[-1]), msg.pos, deadline, progress)
                    finally:
                        msg.pos = progress[0]
                msg.index += 1
                msg.pos = 0
        except BaseException as exc:
            if isinstance(exc, TimeoutError) or not isinstance(exc, Exception):
                self._partial = msg
            raise
        self._partial = None
        msg.shm = None
        return msg.raw, out

    def _next(self, deadline: Optional[float]) -> tuple[bool, list]:
        msg = self._partial or self._read_head(deadline)
        return self._finish(msg, deadline)

    def recv(self, deadline: Optional[float]) -> tuple[bool, list]:
        if self._ahead_cond is not None:
            return self._pop_ahead(deadline)
        with self._rlock:
            return self._next(deadline)

    def poll_fd(self) -> Optional[int]:
        """The socket, unless a read-ahead thread owns it (readiness then says nothing about messages)."""
        return self._fd if self._ahead_cond is None else None

    def recv_nowait(self) -> Optional[tuple[bool, list]]:
        """A complete message, or None without waiting or spinning; a message half read is kept for the next call."""
        with self._rlock:
            if (self._rbroken is None and self._partial is None and self._rend - self._rstart < _HEADER.size
                    and not self._poll_in.poll(0)):
                return None  # no whole message buffered, nothing arrived: no read (an empty one costs 10 us)
            spin, self._spin = self._spin, 0.0
            bounded, self._reads_bounded = self._reads_bounded, False  # reads on while bytes are there
            try:
                return self._next(time.monotonic())  # a passed deadline: the first EAGAIN raises TimeoutError
            except TimeoutError:
                return None
            finally:
                self._spin, self._reads_bounded = spin, bounded

    def recv_into(self, targets: Sequence, deadline: Optional[float]) -> bool:
        views = [memoryview(t).cast("B") for t in targets]
        if self._ahead_cond is not None:
            return _fill_targets(*self._pop_ahead(deadline), views)
        with self._rlock:
            if self._partial is not None:  # an earlier receive timed out midway: finish that message first
                return _fill_targets(*self._finish(self._partial, deadline), views)
            msg = self._read_head(deadline)
            frames = msg.frames
            if len(frames) != len(views) or any(n != v.nbytes for (_, _, _, n), v in zip(frames, views)):
                return _fill_targets(*self._finish(msg, deadline), views)  # raises ValueError, message consumed
            # the fast path: straight into the caller's buffers, one copy
            shm_seg = None
            i = pos = 0
            try:
                for i, (where, seg_id, off, n) in enumerate(frames):
                    pos = 0
                    if where == SHM:
                        self._cache.copy_out(seg_id, off, n, views[i])
                        shm_seg = seg_id
                    elif n:
                        progress = [0]
                        try:
                            self._read_into(views[i], 0, deadline, progress)
                        finally:
                            pos = progress[0]
            except TimeoutError:
                # keep what arrived, in buffers of our own, for the next receive
                msg.out = [bytearray(views[j]) for j in range(i)]
                msg.out.append(_receive_buffer(frames[i][3]))
                msg.out[-1][:pos] = views[i][:pos]
                msg.index, msg.pos = i, pos
                self._partial = msg
                if shm_seg is not None and not any(w == SHM for w, _s, _o, _n in frames[i:]):
                    self._cache.release(shm_seg)  # else the resumed receive's view frees it
                raise
            if shm_seg is not None:  # only now: a later frame may share the segment
                self._cache.release(shm_seg)
            return msg.raw

    def take_fds(self) -> list[int]:
        """Descriptors that arrived with the messages received so far and no segment claimed; the caller owns them."""
        with self._rlock:
            fds, self._fds = self._fds, []
            return fds

