"""The CPU transport's wire format, and the pieces of a message every part of a link shares.

Wire format of one message::

    header  <BBHHH>   kind, flags, nframes, nnew, ndrop
    nnew  x <IxxxxQ>  new segment id, capacity   (fds ride along, SCM_RIGHTS)
    ndrop x <I>       segment ids the receiver may unmap
    nframes x <BxxxIQQ> where (0 inline, 1 shm), segment id, offset, length
    inline frame bytes, in order

Also here: a message half received (``_Partial``, kept when a receive's
deadline passes midway), the buffers a receiver reads frames into, and the
deadline arithmetic the link's sending, receiving and read-ahead share.
"""

from __future__ import annotations

import struct
import time
from typing import Optional

_HEADER = struct.Struct("<BBHHH")
_NEWSEG = struct.Struct("<IxxxxQ")
_DROP = struct.Struct("<I")
_FRAME = struct.Struct("<BxxxIQQ")
KIND_DATA = 1
FLAG_RAW = 1
INLINE, SHM = 0, 1
_CHUNK = 1 << 16
_ALIGN = 64
_MAX_FDS = 64


def _message_head(raw: bool, descs: list, newsegs: list = (), drops: list = ()) -> bytes:
    """The packed head of a message of ``len(descs)`` frames: header, new segments, dropped ones, frames."""
    return b"".join([_HEADER.pack(KIND_DATA, FLAG_RAW if raw else 0, len(descs), len(newsegs), len(drops)),
                     *newsegs, *drops, *descs])


class _Partial:
    """A message whose head has been read but whose inline frames are still arriving.

    Kept on the link when a receive's deadline passes mid-message, so the next
    receive resumes where that one stopped: a deadline never costs the stream.
    """

    __slots__ = ("raw", "frames", "out", "index", "pos", "shm")

    def __init__(self, raw: bool, frames: list):
        self.raw = raw
        self.frames = frames  # (where, seg_id, offset, length)
        self.shm = None  # one view of the segment, sliced for every shared-memory frame
        self.out: list = []  # finished buffers, one per frame so far
        self.index = 0  # frame being read
        self.pos = 0  # bytes of it read so far (into out[index])


#: frames at least this large are received into memory that is not zero-filled first
_LAZY_BUFFER = 1 << 20


def _receive_buffer(n: int):
    """A writable buffer of ``n`` bytes, owned by the receiver, for a frame read from the socket.

    A large one is a numpy array, which is not zero-filled (``bytearray(n)`` is): filling touches
    every fresh page before the first byte is read, and each first touch is a page fault (2.3 us
    on a test virtual machine: 0.6 s of CPU for 1 GiB), so a receiver would read nothing, and its
    sender see no progress, for that long; untouched, fresh pages are faulted in as the bytes
    land, and memory the allocator reuses is not written twice.  Filling a buffer measured there:
    np.empty 44-81 GB/s up to 16 MiB and 2.2 GB/s at 256 MiB, bytearray 13-47 and 1.9 GB/s, a
    fresh anonymous mapping 1.4-1.5 GB/s."""
    if n < _LAZY_BUFFER:
        return bytearray(n)
    import numpy as np

    return np.empty(n, dtype=np.uint8)


def _fill_targets(raw: bool, frames: list, views: list) -> bool:
    """Copy a whole received message into the caller's buffers, or raise ``ValueError`` if they do not fit."""
    sizes = [memoryview(f).nbytes for f in frames]
    if sizes != [v.nbytes for v in views]:
        raise ValueError(f"the message holds buffers of {sizes} bytes, the receiver offered {[v.nbytes for v in views]}")
    for v, f in zip(views, frames):
        v[:] = memoryview(f).cast("B")
    return raw


def _remaining(deadline: Optional[float]) -> Optional[float]:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left
