"""Receive buffers of the channel host: how a queued item comes to own its memory.

``_own`` copies the frames of a put that view a producer's memory (its shared
memory segment, a buffer of the link), so a queued, parked or in-flight item
never pins them; frames of ``_MAPPED_MIN`` bytes or more go to anonymous
mappings that ``_BlockPool`` recycles by size once their items are consumed.
"""

from __future__ import annotations

import mmap
import sys
import threading


#: queued frames at least this large live in anonymous mappings, not on the heap
_MAPPED_MIN = 1 << 16
#: bytes of such mappings kept for reuse once their items are consumed
_POOL_BYTES = 64 << 20


class _BlockPool:
    """Anonymous mappings for queued frames, reused by size.

    Mappings go back to the system when not reused (the heap would keep a
    burst of queued items resident long after they were consumed), and
    recycling them keeps a steady stream free of page faults.
    """

    def __init__(self):
        self._free: dict[int, list] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, size: int):
        with self._lock:
            blocks = self._free.get(size)
            if blocks:
                self._bytes -= size
                return blocks.pop()
        return mmap.mmap(-1, size)

    def give_back(self, frames) -> None:
        for f in frames:
            if isinstance(f, mmap.mmap):
                with self._lock:
                    if self._bytes + len(f) <= _POOL_BYTES:
                        self._free.setdefault(len(f), []).append(f)
                        self._bytes += len(f)
                        continue
                try:
                    f.close()
                except BufferError:
                    # a send that already copied it out may still hold a view for an instant (the
                    # client can acknowledge before that send returns): unmapped when the view goes
                    pass


def _own(frames: list, pool: _BlockPool) -> tuple:
    """Copy frames that view a producer's shared memory, so a queued item does
    not pin the producer's segment (which it would otherwise have to replace).

    A tuple: a queued item (frames, weight, sequence) then holds no object the
    garbage collector tracks, so a host with many items queued does not scan
    them all over again (with a million queued items, collections had taken
    a third of the host's time)."""
    out = []
    for f in frames:
        # numpy is loaded once a frame is one of its arrays: a worker that hosts no channel never loads it
        np = sys.modules.get("numpy")
        if isinstance(f, (bytes, bytearray, mmap.mmap)) or (np is not None and isinstance(f, np.ndarray) and f.base is None):
            out.append(f)  # memory of its own (a numpy array with no base owns its data)
            continue
        view = memoryview(f).cast("B")
        if view.nbytes >= _MAPPED_MIN:
            block = pool.take(view.nbytes)
            block[:] = view
            out.append(block)
        else:
            out.append(bytearray(view))
    return tuple(out)
