"""Shared-memory segments for same-host transfers, with no names to leak.

Segments are anonymous ``memfd`` files: their descriptors travel over a Unix
socket (``SCM_RIGHTS``), so nothing appears in ``/dev/shm`` and the kernel
frees the memory when the last process unmaps it, even after a crash.

Mappings are made with ``mmap(2)`` directly rather than Python's ``mmap``
module, which keeps a duplicate descriptor open per mapping: with many peers
and segments that would run into the process's descriptor limit.  A
mapping lives exactly as long as the buffer object returned for it (numpy
views keep it alive), so it is never unmapped under a live tensor.

The first page of a segment holds a state word.  The sender sets it to
BUSY before handing the segment over; the receiver sets it back to FREE when
every tensor viewing the segment has been garbage collected (or, for
``recv_into``, once every frame of the message has been copied out).  The
sender reuses FREE segments (already faulted in, so the copy runs at memcpy
speed) without any message flowing back.  When the receiver holds too much,
the sender does not wait: its buffers go inline through the socket.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct
import threading
import weakref
from typing import Optional

import numpy as np

PAGE = 4096
DATA_OFFSET = PAGE
FREE, BUSY = 0, 1
_STATE = struct.Struct("<Q")
_ROUND = 1 << 20

POOL_ENV = "RLINF_SHM_POOL_MB"
#: copies at least this large are split across threads (numpy releases the GIL while copying)
PARALLEL_COPY_MIN = 8 << 20
_copy_pool = None
_copy_pool_lock = threading.Lock()


_COPY_THREADS = max(1, min(os.cpu_count() or 1, 4))


def parallel_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src`` for flat uint8 arrays, split over a few threads when large."""
    global _copy_pool
    n = src.nbytes
    threads = _COPY_THREADS
    if n < PARALLEL_COPY_MIN or threads == 1:
        np.copyto(dst, src)
        return
    if _copy_pool is None:
        with _copy_pool_lock:
            if _copy_pool is None:
                import concurrent.futures

                _copy_pool = concurrent.futures.ThreadPoolExecutor(threads - 1, thread_name_prefix="rlinf-copy")
    step = -(-n // threads)
    futures = [_copy_pool.submit(np.copyto, dst[i * step : (i + 1) * step], src[i * step : (i + 1) * step]) for i in range(1, threads)]
    np.copyto(dst[:step], src[:step])
    for f in futures:
        f.result()  # unbounded but cannot hang: a memcpy between two mappings this process holds


#: most segments one link may have (in flight plus kept for reuse): each costs a descriptor per side
MAX_SEGMENTS_ENV = "RLINF_SHM_MAX_SEGMENTS"


def _pool_limit() -> int:
    return int(float(os.environ.get(POOL_ENV, "2048")) * (1 << 20))


def _max_segments() -> int:
    return max(2, int(os.environ.get(MAX_SEGMENTS_ENV, "32")))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _map(fd: int, size: int, flags: int):
    addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {size} bytes failed: {os.strerror(err)}")
    buf = (ctypes.c_char * size).from_address(addr)
    # not at exit: tensors may still be on it then (the kernel unmaps everything with the process)
    weakref.finalize(buf, _libc.munmap, addr, size).atexit = False
    return buf


def map_shared(fd: int, size: int):
    """Map ``size`` bytes of ``fd`` read-write and shared; no descriptor is kept.

    Returns a ctypes buffer; the mapping is removed when the buffer and every
    view of it have been garbage collected.
    """
    return _map(fd, size, mmap.MAP_SHARED)


def map_private(fd: int, size: int):
    """Map ``size`` bytes of ``fd`` copy-on-write: reads share the file's pages, writes stay in this process.

    ``broadcast`` hands receivers zero-copy tensors this way: each may write
    to its own without the others (or the writer of the segment) seeing it.
    The source never rewrites a segment a receiver still maps this way.
    """
    return _map(fd, size, mmap.MAP_PRIVATE)


class Segment:
    __slots__ = ("seg_id", "capacity", "fd", "mm", "view", "uid", "token")

    def __init__(self, seg_id: int, capacity: int, fd: int, mm):
        self.uid = self.token = None  # names other processes can use (broadcast's segments and their lendings)
        self.seg_id = seg_id
        self.capacity = capacity  # bytes available for data
        self.fd = fd
        self.mm = mm
        self.view = np.frombuffer(mm, dtype=np.uint8)

    def state(self) -> int:
        return _STATE.unpack_from(self.mm, 0)[0]

    def set_state(self, value: int) -> None:
        _STATE.pack_into(self.mm, 0, value)

    def close(self) -> None:
        self.view = None
        self.mm = None  # unmapped once no view of it is left
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def create_segment(seg_id: int, nbytes: int) -> Segment:
    capacity = -(-nbytes // _ROUND) * _ROUND
    fd = os.memfd_create(f"rlinf-{seg_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, DATA_OFFSET + capacity)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)  # a receiver maps it whole: it never shrinks
        mm = map_shared(fd, DATA_OFFSET + capacity)
    except BaseException:
        os.close(fd)
        raise
    seg = Segment(seg_id, capacity, fd, mm)
    seg.set_state(FREE)
    return seg


class SenderPool:
    """The segments one link's sender owns; picks a FREE one or makes a new one."""

    def __init__(self):
        self._segments: dict[int, Segment] = {}
        self._next_id = 1
        self._lock = threading.Lock()
        self._dropped: list[int] = []

    def acquire(self, nbytes: int) -> Optional[tuple[Segment, bool]]:
        """A segment with room for ``nbytes``, marked BUSY, and ``True`` if newly created.

        ``None`` when the receiver already holds ``RLINF_SHM_POOL_MB`` (or
        ``RLINF_SHM_MAX_SEGMENTS`` segments) of this link's memory: the caller
        then sends the buffers inline through the socket.  Never waiting here
        means a receiver that keeps every tensor it got (they are zero-copy
        views of these segments) can never stall its sender.
        """
        with self._lock:
            best: Optional[Segment] = None
            busy = 0
            for seg in self._segments.values():
                if seg.state() != FREE:
                    busy += seg.capacity
                elif nbytes <= seg.capacity <= max(2 * nbytes, nbytes + 8 * _ROUND):
                    if best is None or seg.capacity < best.capacity:
                        best = seg
            created = False
            if best is None and len(self._segments) >= _max_segments():
                self._drop_one_free()
            if best is None and (busy == 0 or busy + nbytes <= _pool_limit()) and len(self._segments) < _max_segments():
                best = create_segment(self._next_id, nbytes)
                self._next_id += 1
                self._segments[best.seg_id] = best
                created = True
            if best is None:
                return None
            best.set_state(BUSY)
            self._trim(keep=best.seg_id)
            return best, created

    def unsent(self, seg: Segment, created: bool, dropped: list[int]) -> None:
        """The message carrying ``seg`` never left: free it, or forget it if the receiver never learnt of it.

        ``dropped`` are the ids that message would have told the receiver to unmap; they go out with the next one.
        """
        with self._lock:
            self._dropped[:0] = dropped
            if created:
                self._segments.pop(seg.seg_id, None)
                seg.close()
            elif self._segments.get(seg.seg_id) is seg:  # else the pool closed meanwhile (and unmapped it)
                seg.set_state(FREE)

    def _drop_one_free(self) -> None:
        """Make room for a segment of another size by dropping the largest free one."""
        free = [s for s in self._segments.values() if s.state() == FREE]
        if free:
            seg = max(free, key=lambda s: s.capacity)
            del self._segments[seg.seg_id]
            self._dropped.append(seg.seg_id)
            seg.close()

    def _trim(self, keep: int) -> None:
        limit = _pool_limit()
        total = sum(s.capacity for s in self._segments.values())
        if total <= limit:
            return
        for seg in sorted(self._segments.values(), key=lambda s: -s.capacity):
            if total <= limit:
                break
            if seg.seg_id != keep and seg.state() == FREE:
                total -= seg.capacity
                del self._segments[seg.seg_id]
                self._dropped.append(seg.seg_id)
                seg.close()

    def sent(self, seg: Segment) -> None:
        """The receiver has the descriptor now; ours is no longer needed (the mapping stays)."""
        if seg.fd >= 0:
            os.close(seg.fd)
            seg.fd = -1

    def take_dropped(self) -> list[int]:
        with self._lock:
            dropped, self._dropped = self._dropped, []
            return dropped

    def close(self) -> None:
        with self._lock:
            for seg in self._segments.values():
                seg.close()
            self._segments.clear()


def _mark_free(mm) -> None:
    try:
        _STATE.pack_into(mm, 0, FREE)
    except ValueError:
        pass  # already unmapped


class ReceiverCache:
    """The segments a link's receiver has mapped, by sender-assigned id."""

    def __init__(self):
        self._maps: dict = {}

    def add(self, seg_id: int, fd: int, capacity: int) -> None:
        """Map a segment the sender announced; ``ValueError`` (nothing mapped) if ``fd`` is not a memfd
        sealed against shrinking that holds ``capacity`` bytes of data: reading a mapping past the
        file's end kills the process (SIGBUS), so a buggy or hostile sender's lie is refused here."""
        try:
            size = DATA_OFFSET + capacity
            try:
                sealed = fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
            except OSError:
                sealed = 0  # not a memfd
            real = os.fstat(fd).st_size
            if not sealed or real < size:
                raise ValueError(f"a shared-memory segment announced as {size} bytes is a file of {real} bytes"
                                 + ("" if sealed else " not sealed against shrinking"))
            self._maps[seg_id] = map_shared(fd, size)
        finally:
            os.close(fd)

    def drop(self, seg_id: int) -> None:
        self._maps.pop(seg_id, None)  # unmapped once no tensor views it

    def view(self, seg_id: int, offset: int, length: int) -> np.ndarray:
        """A zero-copy view; the segment is FREE again once the view and all its slices are gone."""
        mm = self._maps[seg_id]
        whole = np.frombuffer(mm, dtype=np.uint8, count=length, offset=DATA_OFFSET + offset)
        weakref.finalize(whole, _mark_free, mm)
        return whole

    def copy_out(self, seg_id: int, offset: int, length: int, target) -> None:
        """Copy one frame out; the segment stays BUSY (``release`` it once the whole message is out)."""
        mm = self._maps[seg_id]
        src = np.frombuffer(mm, dtype=np.uint8, count=length, offset=DATA_OFFSET + offset)
        parallel_copy(np.frombuffer(target, dtype=np.uint8), src)

    def release(self, seg_id: int) -> None:
        mm = self._maps.get(seg_id)
        if mm is not None:
            _mark_free(mm)

    def close(self) -> None:
        self._maps.clear()
