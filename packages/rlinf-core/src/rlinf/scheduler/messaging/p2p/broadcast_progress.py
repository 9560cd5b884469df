"""The progress word of a broadcast segment: receivers copy chunk k while the source writes chunk k+1.

The source hands its segment to the receivers on its host *before* it writes
the payload into it (``broadcast_shm``), then writes it in chunks, in layout
order, and after each chunk publishes how many bytes of the layout are
written.  Receivers with ``out=`` copy each part as soon as it is published,
so the source's write and the receivers' reads overlap instead of adding up.

The word lives in the segment's first page (``PROGRESS_OFFSET``), one aligned
64-bit word, written by the source only, so a reader never sees half of it:

* its high ``64 - _DONE_BITS`` bits are the broadcast's *generation*, new for
  every broadcast the segment carries (the pool reuses warm segments,
  ``broadcast_lending``), and told to the receivers with the segment;
* its low ``_DONE_BITS`` bits are the bytes of the layout written so far, or
  ``_FAILED``: the source gave up writing (its receivers raise at once).

Before the segment is handed over, the word is set to (new generation, 0):
a receiver of the next broadcast never takes the previous payload's bytes as
ready, as the generation it was told does not match until the source has
begun this broadcast, and then no byte counts as written before it is.

A receiver waits (``Progress.wait``) with a short spin (``os.sched_yield``)
then sleeps of growing length, bounded by its deadline; every few
milliseconds it also checks its link to the source, which the kernel closes
when the source process dies: a source that dies mid-write makes its
receivers fail at once with a clear error, and in any case by their deadline.

On CPUs that keep stores in order (x86-64: an aligned 8-byte store is
atomic, and a store is never seen before the stores preceding it; glibc's
non-temporal copies end with ``sfence``) the word is published after each
chunk.  Elsewhere the source writes the whole payload before it publishes,
and hands the segment over only then (``PIPELINED`` is False): the socket
that carries the descriptor orders the bytes before the receiver's reads.
"""

from __future__ import annotations

import ctypes
import os
import platform
import time

#: where the word lives: the first page's second cache line (the first holds ``shm``'s state word)
PROGRESS_OFFSET = 64
_DONE_BITS = 44  # up to 16 TiB of payload
_DONE_MASK = (1 << _DONE_BITS) - 1
_GEN_MASK = (1 << (64 - _DONE_BITS)) - 1
_FAILED = _DONE_MASK
#: bytes the source writes between two publications (the receivers' first copy waits for one chunk)
CHUNK = 8 << 20
#: whether the word may be published chunk by chunk on this CPU (see the module's docstring)
PIPELINED = platform.machine().lower() in ("x86_64", "amd64")
#: seconds between checks of the link to the source while waiting
_LINK_CHECK = 0.005


class SourceGone(ConnectionError):
    """The source stopped writing the payload (it failed, or its process died) before it was complete."""


class Progress:
    """The progress word of one segment: the source ``begin``s a broadcast, ``publish``es and ``fail``s;
    receivers ``wait``.

    Args:
        buf: the segment's mapping (a ctypes buffer, or anything ``ctypes`` can take the address of);
            it must stay mapped while this object is used.
    """

    def __init__(self, buf):
        self._buf = buf  # keeps the mapping alive as long as the word is used
        self._word = ctypes.c_uint64.from_buffer(buf, PROGRESS_OFFSET)
        self.gen = 0

    # -- the source ------------------------------------------------------------------------
    def begin(self) -> int:
        """Start a new broadcast on this segment: (next generation, 0 bytes written); returns the generation."""
        gen = ((self._word.value >> _DONE_BITS) + 1) & _GEN_MASK or 1
        self._word.value = gen << _DONE_BITS
        self.gen = gen
        return gen

    def publish(self, done: int) -> None:
        """Say the first ``done`` bytes of the layout are written (``done`` never decreases)."""
        self._word.value = (self.gen << _DONE_BITS) | min(done, _FAILED - 1)

    def fail(self) -> None:
        """Say the source gave up this broadcast: its receivers raise instead of waiting."""
        self._word.value = (self.gen << _DONE_BITS) | _FAILED

    # -- a receiver --------------------------------------------------------------------------
    def wait(self, gen: int, need: int, deadline: float, link=None) -> int:
        """Bytes written (at least ``need``) once the source of generation ``gen`` has written ``need``.

        ``link``: the receiver's link to the source (its ``peer_closed()`` is checked now and then).
        Raises ``SourceGone`` if the source gave up or closed the link, ``TimeoutError`` at ``deadline``.
        """
        spins = 0
        nap = 20e-6
        next_check = 0.0
        while True:
            word = self._word.value
            if word >> _DONE_BITS != gen:
                raise SourceGone(f"the segment carries generation {word >> _DONE_BITS}, not this broadcast's {gen}")
            done = word & _DONE_MASK
            if done == _FAILED:
                raise SourceGone("the source gave up writing the payload")
            if done >= need:
                return done
            if spins < 50:  # the source is usually a chunk ahead: give it the core, briefly
                spins += 1
                os.sched_yield()
                continue
            now = time.monotonic()
            if now >= deadline:
                raise TimeoutError(f"the source wrote {done} of {need} bytes by the deadline")
            if link is not None and now >= next_check:
                if link.peer_closed():
                    raise SourceGone(f"the source closed its link after writing {done} of {need} bytes "
                                     f"(its process may have died)")
                next_check = now + _LINK_CHECK
            time.sleep(min(nap, max(0.0, deadline - now)))
            nap = min(nap * 2, 1e-3)


def write_chunks(progress: Progress, view, buffers: list, offsets: list, total: int, base: int, copy) -> None:
    """Copy ``buffers`` into ``view`` at ``base + offsets[i]``, ``CHUNK`` bytes at a time, publishing after each
    chunk (``PIPELINED``), and the whole layout (``total`` bytes) as written at the end.

    ``copy(dst, src)`` copies flat uint8 arrays.  Raises what ``copy`` raises (the caller then ``fail``s)."""
    import numpy as np

    for b, off in zip(buffers, offsets):
        src = np.frombuffer(b, np.uint8)
        n = src.nbytes
        for pos in range(0, n, CHUNK):
            end = min(n, pos + CHUNK)
            copy(view[base + off + pos : base + off + end], src[pos:end])
            if PIPELINED:
                progress.publish(off + end)
    progress.publish(total)


def read_chunks(progress: Progress, gen: int, whole, offsets: list, sizes: list, targets: list, copy,
                deadline: float, link=None) -> None:
    """Copy each buffer ``i`` of the layout (``whole[offsets[i]:][:sizes[i]]``) into every array of
    ``targets[i]`` as soon as the source of generation ``gen`` has written it, a part at a time.

    Raises what ``Progress.wait`` raises: the destination is then partly written."""
    done = 0
    for off, n, dsts in zip(offsets, sizes, targets):
        dsts = [d for d in dsts if d is not None]
        pos = 0
        while dsts and pos < n:
            need = off + min(n, pos + CHUNK)
            if done < need:
                done = progress.wait(gen, need, deadline, link)
            end = min(n, done - off)
            for dst in dsts:
                copy(dst[pos:end], whole[off + pos : off + end])
            pos = end
