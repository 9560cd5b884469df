"""The MPI transport: links between ranks of one rlinf MPI job.

A link is a pair of tags on the job's ``data`` communicator, chosen by the
connecting side and announced in its hello.  One message is a header
(``<BH`` flags and frame count, then one ``<Q`` size per frame) followed by
the frames.  Messages up to ``INLINE_MAX`` bytes travel as one MPI message;
larger ones send every frame as its own MPI message straight from the
caller's memory (a tensor is never copied on the sender), and ``recv_into``
receives straight into the caller's buffers.

Two ranks that both send a large message before receiving would wait on
each other (MPI's rendezvous protocol).  The service thread therefore reads
ahead on links that nobody is receiving on: a message left unmatched for
``DRAIN_DELAY`` seconds is taken into the link's queue (this is also how a
link that only sends notices that its peer closed it), up to
``READ_AHEAD_BYTES`` per link.
"""

from __future__ import annotations

import collections
import itertools
import struct
import threading
import time
import weakref
from typing import Callable, Optional, Sequence

import numpy as np

from rlinf.scheduler.plugins.transport import READ_AHEAD_MESSAGE_COST, HeldWithin, Link, LinkClosed, Transport

from . import runtime
from .polling import enter_mpi, leave_mpi, wait_for, wait_requests
from .service import TAG_HELLO, rank_alive, send_bytes, service

_HEAD = struct.Struct("<BH")
_SIZE = struct.Struct("<Q")
FLAG_RAW, FLAG_INLINE, FLAG_CLOSE, FLAG_SINGLE = 1, 2, 4, 8
#: first byte of a one-frame inline message: the frame follows directly, no count or sizes
_SINGLE = {False: bytes([FLAG_SINGLE | FLAG_INLINE]), True: bytes([FLAG_SINGLE | FLAG_INLINE | FLAG_RAW])}
INLINE_MAX = 64 << 10
DRAIN_DELAY = 0.02
READ_AHEAD_BYTES = 64 << 20
_TAG_BASE = 16
_link_ids = itertools.count(1)
_live_links: "weakref.WeakSet[MpiLink]" = weakref.WeakSet()
_SIZES = [struct.Struct("<" + "Q" * n) for n in range(8)]
_BYTE = None
_Status = None


def _load_mpi() -> None:
    global _BYTE, _Status
    if _BYTE is None:
        from mpi4py import MPI

        _BYTE, _Status = MPI.BYTE, MPI.Status


def job_id(world: runtime.World) -> str:
    driver = world.ranks[0]
    return f"{driver.hostname}:{driver.pid}"


def _nbytes(frame) -> int:
    return frame.nbytes if isinstance(frame, memoryview) else memoryview(frame).nbytes


def _empty(size: int):
    return np.empty(size, dtype=np.uint8)  # not zeroed: MPI writes every byte


def _take(lock, deadline: Optional[float], what: str) -> None:
    """Hold a link's ``lock`` for one operation, counted as inside MPI (``enter_mpi``): ``HeldWithin``'s
    rules (a bounded wait for another thread's operation) with no object made when the lock is free,
    which it is for nearly every message.  ``_give(lock)`` ends it.

    Raises:
        RuntimeError: the calling thread holds ``lock`` already (an operation inside another).
        LinkBusy: another thread's operation held it until ``deadline``.
        ConnectionError: the rank is ending (MPI_Finalize).
    """
    if lock._is_owned():
        raise RuntimeError(f"a {what} on a link inside another one on the same thread")
    try:
        if not lock.acquire(False):
            HeldWithin(lock, deadline, what).__enter__()
        enter_mpi()
    except BaseException:
        if lock._is_owned():  # taken, then refused or interrupted: never leave it held
            lock.release()
        raise


def _give(lock) -> None:
    """End what ``_take(lock, ...)`` began."""
    leave_mpi()
    lock.release()


class MpiLink(Link):
    def __init__(self, world: runtime.World, peer: int, send_tag: int, recv_tag: int):
        self._comm = world.data
        self.peer = peer
        self._send_tag = send_tag
        self._recv_tag = recv_tag
        self._recv_lock = threading.RLock()  # held for one whole incoming message (HeldWithin)
        self._send_lock = threading.RLock()
        self._ahead: collections.deque = collections.deque()
        self._ahead_bytes = 0
        self._seen_at: Optional[float] = None
        self._open = True
        self._peer_closed = False
        self._keep: list = []  # buffers of sends abandoned midway: MPI may still read them
        _load_mpi()
        self._status = _Status()
        service().add_task(self._read_ahead)
        _live_links.add(self)

    def _alive(self) -> bool:
        return rank_alive(self.peer)

    def is_open(self) -> bool:
        return self._open and not self._peer_closed

    def _check_open(self) -> None:
        if self._peer_closed:
            raise LinkClosed(f"MPI rank {self.peer} closed the link (its worker stopped)")
        if not self._open:
            raise ConnectionError("the link is closed")

    # -- sending ---------------------------------------------------------------------
    def send(self, frames: Sequence, deadline: Optional[float], raw: bool = False) -> None:
        if self._peer_closed or not self._open:
            self._check_open()
        lock = self._send_lock
        _take(lock, deadline, "send")
        try:
            self._send(frames, deadline, raw)
        finally:
            _give(lock)

    def _send(self, frames: Sequence, deadline: Optional[float], raw: bool) -> None:
        """``send`` with the send lock held."""
        comm, peer, tag = self._comm, self.peer, self._send_tag
        if len(frames) == 1:  # the common small object: one MPI message, one byte of header
            frame = frames[0]
            if (len(frame) if type(frame) is bytes else _nbytes(frame)) <= INLINE_MAX:
                message = b"".join((_SINGLE[raw], frame))
                request = comm.Isend([message, _BYTE], peer, tag)
                if not request.Test():  # small messages are buffered by MPI at once
                    self._wait_sent([request], [message], deadline)
                return
        sizes = [_nbytes(f) for f in frames]
        total = sum(sizes)
        inline = total <= INLINE_MAX
        flags = (FLAG_RAW if raw else 0) | (FLAG_INLINE if inline else 0)
        head = _HEAD.pack(flags, len(frames)) + _SIZES[len(sizes)].pack(*sizes) if len(sizes) < 8 else (
            _HEAD.pack(flags, len(frames)) + b"".join(_SIZE.pack(n) for n in sizes))
        if inline:
            message = b"".join([head, *frames])
            request = comm.Isend([message, _BYTE], peer, tag)
            if request.Test():  # small messages are buffered by MPI at once
                return
            requests, keep = [request], [message]
        else:
            requests = [comm.Isend([head, _BYTE], peer, tag)]
            requests += [comm.Isend([f, _BYTE], peer, tag) for f, n in zip(frames, sizes) if n]
            keep = [head, *frames]
        self._wait_sent(requests, keep, deadline)

    def _wait_sent(self, requests: list, keep: list, deadline: Optional[float]) -> None:
        try:
            wait_requests(requests, deadline, "the receiver did not take the message", self._alive)
        except BaseException:
            self._open = False  # a message is half sent: the link cannot be used again
            self._keep.append((requests, keep))
            raise

    # -- receiving -------------------------------------------------------------------
    def _match(self, deadline: Optional[float]):
        """The next message's MPI handle and status, or (None, None) when one was read ahead.

        Called with the receive lock held, so the link's one status object is safe to reuse."""
        status = self._status
        comm, peer, tag = self._comm, self.peer, self._recv_tag
        if not self._ahead:
            message = comm.Improbe(peer, tag, status)
            if message is not None:
                return message, status

        def probe():
            if self._ahead:
                return True
            if not self._open:
                raise ConnectionError("the link was closed")
            return comm.Improbe(peer, tag, status)

        message = wait_for(probe, deadline, "no message from the peer", self._alive)
        if message is True:
            return None, None
        return message, status

    def _receive_head(self, message, status, deadline):
        """Receive a matched header message: (flags, sizes, inline bytes or None)."""
        count = status.Get_count(_BYTE)
        if count <= INLINE_MAX + 4096:
            buf = bytearray(count)
            message.Recv([buf, _BYTE])  # matched and small: its bytes are here already
        else:
            buf = _empty(count)
            wait_requests([message.Irecv([buf, _BYTE])], deadline, "the message did not arrive", self._alive)
        if buf[0] & FLAG_SINGLE:
            return buf[0], [count - 1], memoryview(buf)[1:]
        flags, nframes = _HEAD.unpack_from(buf, 0)
        sizes = list(_SIZES[nframes].unpack_from(buf, _HEAD.size)) if nframes < 8 else [
            _SIZE.unpack_from(buf, _HEAD.size + 8 * i)[0] for i in range(nframes)]
        if flags & FLAG_CLOSE:
            self._peer_closed = True
            raise LinkClosed(f"MPI rank {self.peer} closed the link (its worker stopped)")
        offset = _HEAD.size + 8 * nframes
        return flags, sizes, (memoryview(buf)[offset:] if flags & FLAG_INLINE else None)

    def _receive_frames(self, flags, sizes, body, targets, deadline) -> None:
        if body is not None:
            pos = 0
            for target, n in zip(targets, sizes):
                memoryview(target).cast("B")[:n] = body[pos:pos + n]
                pos += n
            return
        requests = [self._comm.Irecv([t, _BYTE], self.peer, self._recv_tag) for t, n in zip(targets, sizes) if n]
        try:
            wait_requests(requests, deadline, "the message did not arrive in full", self._alive)
        except BaseException:
            self._open = False
            raise

    def _next_message(self, deadline) -> tuple:
        """(flags, buffers) of the next message, from the read-ahead queue or from MPI."""
        message, status = self._match(deadline)
        if message is None:
            return self._pop_ahead()
        return self._receive_message(message, status, deadline)

    def _receive_message(self, message, status, deadline) -> tuple:
        """(flags, buffers) of a matched message: inline frames are views of its one buffer."""
        flags, sizes, body = self._receive_head(message, status, deadline)
        if body is not None:
            if len(sizes) == 1:
                return flags, [body]
            out, pos = [], 0
            for n in sizes:
                out.append(body[pos:pos + n])
                pos += n
            return flags, out
        buffers = [_empty(n) for n in sizes]
        self._receive_frames(flags, sizes, None, buffers, deadline)
        return flags, buffers

    def recv(self, deadline: Optional[float]) -> tuple[bool, list]:
        if self._peer_closed or not self._open:
            self._check_open()
        lock = self._recv_lock
        _take(lock, deadline, "receive")
        try:
            flags, buffers = self._next_message(deadline)
        finally:
            _give(lock)
        if flags & FLAG_INLINE:
            return bool(flags & FLAG_RAW), buffers
        return bool(flags & FLAG_RAW), [memoryview(b) if isinstance(b, np.ndarray) else b for b in buffers]

    def recv_into(self, targets: Sequence, deadline: Optional[float]) -> bool:
        self._check_open()
        wanted = [_nbytes(t) for t in targets]
        lock = self._recv_lock
        _take(lock, deadline, "receive")
        try:
            return self._recv_into(targets, wanted, deadline)
        finally:
            _give(lock)

    def _recv_into(self, targets: Sequence, wanted: list, deadline: Optional[float]) -> bool:
        """``recv_into`` with the receive lock held."""
        message, status = self._match(deadline)
        if message is None:  # read ahead while we waited
            return self._recv_into_ahead(targets, wanted)
        flags, sizes, body = self._receive_head(message, status, deadline)
        if sizes != wanted:
            self._receive_frames(flags, sizes, body, [_empty(n) for n in sizes], deadline)  # consume it
            raise ValueError(f"message of {sizes} bytes per frame, buffers of {wanted}")
        self._receive_frames(flags, sizes, body, targets, deadline)
        return bool(flags & FLAG_RAW)

    def _pop_ahead(self) -> tuple:
        """The oldest message the service thread read ahead: (flags, buffers)."""
        flags, buffers, size = self._ahead.popleft()
        self._ahead_bytes -= size
        if flags & FLAG_CLOSE:
            self._peer_closed = True
            raise LinkClosed(f"MPI rank {self.peer} closed the link (its worker stopped)")
        return flags, buffers

    def _recv_into_ahead(self, targets, wanted) -> bool:
        flags, buffers = self._pop_ahead()
        got = [_nbytes(b) for b in buffers]
        if got != wanted:
            raise ValueError(f"message of {got} bytes per frame, buffers of {wanted}")
        for target, b in zip(targets, buffers):
            memoryview(target).cast("B")[:] = memoryview(b).cast("B")
        return bool(flags & FLAG_RAW)

    # -- read-ahead (service thread) -------------------------------------------------------
    def _read_ahead(self) -> bool:
        if not self._open or self._peer_closed or self._ahead_bytes >= READ_AHEAD_BYTES:
            return False
        if not self._recv_lock.acquire(blocking=False):
            return False  # someone is receiving: they will take it
        try:
            status = self._status  # ours while the receive lock is held
            if not self._comm.Iprobe(self.peer, self._recv_tag, status):
                self._seen_at = None
                return False
            now = time.monotonic()
            if self._seen_at is None:
                self._seen_at = now
            if now - self._seen_at < DRAIN_DELAY:
                return False  # a receiver that is about to take it should get it straight from MPI
            self._seen_at = None
            message = self._comm.Improbe(self.peer, self._recv_tag, status)
            if message is None:
                return False
            try:
                flags, buffers = self._receive_message(message, status, now + 60)
            except ConnectionError:
                self._ahead.append((FLAG_CLOSE, [], 0))
                return True
            size = sum(_nbytes(b) for b in buffers) + READ_AHEAD_MESSAGE_COST
            self._ahead.append((flags, buffers, size))
            self._ahead_bytes += size
            return True
        except Exception:
            self._open = False
            return False
        finally:
            self._recv_lock.release()

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        service().remove_task(self._read_ahead)
        if not self._peer_closed:
            try:  # tell the peer, so that its next send or receive fails instead of waiting
                send_bytes(self._comm, _HEAD.pack(FLAG_CLOSE, 0), self.peer, self._send_tag, time.monotonic() + 1.0)
            except Exception:
                pass


class MpiTransport(Transport):
    name = "mpi"

    def __init__(self):
        self._world = runtime.world()
        self._links: list[MpiLink] = []
        self._on_accept: Optional[Callable] = None
        self._listener: Optional[int] = None

    def listen(self, on_accept, local_ip: str) -> dict:
        self._on_accept = on_accept
        self._listener = service().add_listener(self._accept)
        return {"job": job_id(self._world), "rank": self._world.rank, "listener": self._listener}

    def _accept(self, source: int, data: bytes) -> None:
        (link_id,) = struct.unpack_from("<Q", data, 0)
        tag = _TAG_BASE + 2 * link_id
        link = MpiLink(self._world, source, send_tag=tag + 1, recv_tag=tag)
        self._links.append(link)
        if self._on_accept is None:
            link.close()
            return
        self._on_accept(link, data[8:])

    def connect(self, endpoint: dict, hello: bytes, deadline: Optional[float]) -> Link:
        if endpoint.get("job") != job_id(self._world):
            raise ConnectionError(f"the peer is in another MPI job ({endpoint.get('job')}), not {job_id(self._world)}")
        peer = int(endpoint["rank"])
        link_id = next(_link_ids)
        tag = _TAG_BASE + 2 * link_id
        link = MpiLink(self._world, peer, send_tag=tag, recv_tag=tag + 1)
        address = struct.pack("<QQ", int(endpoint["listener"]), link_id)
        send_bytes(self._world.data, address + hello, peer, TAG_HELLO, deadline)
        self._links.append(link)
        return link

    def probe(self, endpoint: dict) -> bool:
        return endpoint.get("job") != job_id(self._world) or rank_alive(int(endpoint["rank"]))

    def close(self) -> None:
        if self._listener is not None:
            service().remove_listener(self._listener)
            self._listener = None
        for link in self._links:
            link.close()
        self._links.clear()



def _close_all_links() -> None:
    """Before ``MPI_Finalize``: close every link, so no thread is left waiting in MPI."""
    for link in list(_live_links):
        link._open = False


runtime.before_finalize(_close_all_links)  # after service's registration, so it runs first
