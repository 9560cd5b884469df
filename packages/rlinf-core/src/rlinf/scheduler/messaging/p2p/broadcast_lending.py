"""The broadcast segment pool: segments lent to receivers, reused once every view of them is gone.

A source writes a payload for the receivers on its host once, into a ``memfd``
segment (``broadcast_shm``).  Faulting in fresh memory costs more than the
copy itself, so segments are reused: the source keeps a segment for the next
broadcast once every receiver copied out, and a receiver with ``out=`` keeps
its mapping of its feeder's segment (one per feeder), so a training loop's
broadcasts touch only warm pages.  A segment a receiver still holds views of
(or moved its tensors' storages onto, ``share_memory=True``) is *lent*,
never written: each lending has a fresh token, the receiver reports it
released (with its next connection to that feeder, ``broadcast_links``) once
the last view is gone, and only then does it go back to the pool.  A source
holds at most one free segment and three lent ones (a receiver swapping
weights holds the last round's views while the next arrives: two are lent
then); past that the oldest lent one is closed on the source, and the kernel
frees it with its last view.
"""

from __future__ import annotations

import collections
import os
import secrets
import threading
import time
import weakref
from typing import Optional

#: segments a source keeps ready for reuse, and segments it keeps while receivers hold views of them
#: (receivers that swap weights hold the last round's views while the next arrives: two are lent then)
_MAX_FREE = 1
_MAX_LENT = 3
#: mappings a receiver keeps per feeder: receivers sharing memory alternate between two segments
_MAX_MAPPED = 3
#: release reports a receiver keeps per source until its next connection there (the source lends at most 3)
_MAX_REPORTS = 16



class _Segments:
    """One communicator's broadcast segments, as a source (free and lent) and as a receiver (kept mappings,
    release reports)."""

    def __init__(self):
        self.segment_lock = threading.Lock()
        self.next_seg_id = 1 << 31  # apart from the ids of a link's own pool
        self.closed = False
        # source side
        self.free: list = []  # segments no receiver maps: written over by the next broadcast
        self.lent: "collections.OrderedDict[str, tuple]" = collections.OrderedDict()  # token -> (seg, holders)
        self.early: "collections.OrderedDict[str, set]" = collections.OrderedDict()  # released before we recorded the lending
        self.last_served = time.monotonic()
        # receiver side
        # feeder -> [{(uid, dev, inode, size): shared mapping}, most recently used last; when last used]
        self.mapped: dict[str, list] = {}
        # feeder -> the private memory that tensors left for its segments in the last broadcast, freed at the
        # next one: a kernel another thread started on the old memory may still be reading it
        self.retired: dict[str, list] = {}
        self.released: dict[str, list] = {}  # feeder -> lending tokens of its segments whose views we dropped
        # filled by garbage-collector finalizers, which may run on a thread holding segment_lock: so no lock,
        # only an append (atomic); drained by released_to
        self.reports: collections.deque = collections.deque(maxlen=4096)

    # -- segments, source side --------------------------------------------------------
    def acquire_segment(self, nbytes: int):
        """A segment no receiver maps, with room for ``nbytes``: a warm one from the pool if one fits."""
        from ...transports.shm import create_segment

        with self.segment_lock:
            self.last_served = time.monotonic()
            for seg in self.free:
                if nbytes <= seg.capacity <= max(2 * nbytes, nbytes + (8 << 20)):
                    self.free.remove(seg)
                    seg.token = secrets.token_hex(8)  # a fresh name per lending: a stale release cannot match it
                    return seg
            unfit, self.free = self.free, []  # the payload changed size: no stale segment stays held
            self.next_seg_id += 1
            seg_id = self.next_seg_id
        for old in unfit:
            old.close()
        seg = create_segment(seg_id, nbytes)
        seg.uid = secrets.token_hex(8)  # names the segment itself to receivers, apart from any other one
        seg.token = secrets.token_hex(8)
        return seg

    def release_segment(self, seg, holders: set, reusable: bool) -> None:
        """After a broadcast: back to the pool, lent to the receivers in ``holders`` (they keep views of
        it), or closed (a receiver that timed out may still read it)."""
        closing = []
        with self.segment_lock:
            holders = set(holders) - self.early.pop(seg.token, set())  # some may have let go already
            if not reusable or self.closed:
                closing.append(seg)
            elif holders:
                self.lent[seg.token] = (seg, holders)
                while len(self.lent) > _MAX_LENT:  # receivers that never come back: the kernel frees it with their views
                    closing.append(self.lent.popitem(last=False)[1][0])
            else:
                self._to_pool(seg, closing)
        for old in closing:
            old.close()

    def _to_pool(self, seg, closing: list) -> None:  # under segment_lock
        self.free.insert(0, seg)
        while len(self.free) > _MAX_FREE:
            closing.append(self.free.pop())

    def _returned(self, peer: str, tokens: list) -> None:
        """``peer`` dropped its views of these segments of ours; one nobody holds goes back to the pool."""
        closing = []
        with self.segment_lock:
            for token in tokens:
                entry = self.lent.get(token)
                if entry is None:  # perhaps before the broadcast that lent it recorded the lending
                    self.early.setdefault(token, set()).add(peer)
                    while len(self.early) > 4 * _MAX_REPORTS:
                        self.early.popitem(last=False)
                    continue
                entry[1].discard(peer)
                if not entry[1]:
                    del self.lent[token]
                    self._to_pool(entry[0], closing)
        for old in closing:
            old.close()


    # -- segments, receiver side ------------------------------------------------------------
    def released_to(self, name: str) -> list:
        """The lending tokens of ``name``'s segments whose views we dropped: told on our next connection to it."""
        with self.segment_lock:
            while self.reports:
                feeder, token = self.reports.popleft()
                self.released.setdefault(feeder, []).append(token)
            return self.released.pop(name, [])[-_MAX_REPORTS:]  # older ones were lent past the source's bound

    def shared_mapping(self, feeder: str, uid: Optional[str], fd: int, size: int):
        """A read-write mapping of the segment behind ``fd``: one kept from ``feeder``'s last broadcasts if
        it is the same segment (its pages are mapped already), else a new one, kept (``_MAX_MAPPED``)."""
        from ...transports.shm import map_shared

        st = os.fstat(fd)
        key = (uid, st.st_dev, st.st_ino, size)
        with self.segment_lock:
            entry = self.mapped.get(feeder)
            if entry is not None and key in entry[0]:
                entry[0].move_to_end(key)
                entry[1] = time.monotonic()
                return entry[0][key]
        buf = map_shared(fd, size)
        with self.segment_lock:
            entry = self.mapped.setdefault(feeder, [collections.OrderedDict(), 0.0])
            entry[0][key] = buf
            while len(entry[0]) > _MAX_MAPPED:  # unmapped once nothing views it
                entry[0].popitem(last=False)
            entry[1] = time.monotonic()
        return buf

    def forget_mapping(self, feeder: str) -> None:
        with self.segment_lock:
            self.mapped.pop(feeder, None)

    def drop_idle(self, idle: float) -> int:
        """Let go of segments no broadcast used for ``idle`` seconds; returns how many.

        As a receiver: the mapping kept from a source that stopped broadcasting
        (or whose group ended) would keep that segment's memory alive.  As a
        source: its pool, free and lent (a receiver that never connects again
        never reports its views gone; the kernel frees those with the views)."""
        now = time.monotonic()
        closing = []
        with self.segment_lock:
            stale = [f for f, entry in self.mapped.items() if now - entry[1] >= idle]
            for feeder in stale:
                del self.mapped[feeder]
                self.retired.pop(feeder, None)
            if now - self.last_served >= idle:
                closing = self.free + [seg for seg, _h in self.lent.values()]
                self.free = []
                self.lent.clear()
        for seg in closing:
            seg.close()
        return len(stale) + len(closing)

    def lend(self, feeder: str, token: Optional[str], buf) -> None:
        """Report ``token`` released to ``feeder`` (on our next connection to it) once ``buf`` is gone."""
        if token is not None:
            weakref.finalize(buf, self.reports.append, (feeder, token))  # no lock: see reports


    def close(self) -> None:
        with self.segment_lock:
            self.closed = True
            segs = self.free + [seg for seg, _h in self.lent.values()]
            self.free, self.mapped, self.retired = [], {}, {}
            self.lent.clear()
        for seg in segs:
            seg.close()
