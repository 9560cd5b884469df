"""The shared-memory fan-out: a broadcast's payload written once, read by every receiver on the source's host.

The source takes a segment from its pool (``_open_segment``;
``broadcast_lending``), starts a new generation of its progress word
(``broadcast_progress``), hands that same segment to each receiver on its
host (``SocketLink.send_fds``, ``SCM_RIGHTS``) and then writes the payload
into it once, chunk by chunk (``_fill_segment``), publishing its progress.
A receiver (``_read_segment``) with ``out=`` copies each part out as soon as
it is written (in parallel with the others, and with the source's write)
through the mapping it keeps of its feeder's segment; one without waits for
the whole payload, maps it copy-on-write and gets tensors that are views of
it (zero copies; its writes stay its own); one with ``out=`` and
``share_memory=True`` waits likewise, then moves its tensors' storages onto
it (``broadcast_out._share``).  A segment a receiver keeps views of, or
storages on, is lent to it until they are gone.
"""

from __future__ import annotations

import os

from ...transports import codec
from .broadcast_out import _share, _unshare
from .broadcast_payload import _dumps, _layout
from .broadcast_progress import Progress, read_chunks, write_chunks


def _open_segment(state, meta: dict, readers: int) -> tuple:
    """``(segment, progress, description)``: a segment of ``state``'s pool with room for the payload, its
    progress word at a new generation (nothing written yet), and the description (``meta`` plus the segment's
    size, names and generation) the ``readers`` who map it receive first."""
    from ...transports.shm import DATA_OFFSET

    _offsets, total = _layout(meta["sizes"])
    seg = state.acquire_segment(max(total, 1))
    try:
        progress = Progress(seg.mm)
        gen = progress.begin()
        shm_meta = _dumps({**meta, "segment": DATA_OFFSET + seg.capacity, "token": seg.token, "uid": seg.uid,
                           "readers": readers, "gen": gen})
    except BaseException:  # never reused: nobody was told of it
        seg.close()
        raise
    return seg, progress, shm_meta


def _fill_segment(seg, progress: Progress, meta: dict, buffers: list) -> None:
    """Write the payload into ``seg``, publishing progress as it goes; on any error the receivers are told
    (``Progress.fail``) and it is raised.  The caller closes the segment then: it is never reused."""
    from ...transports.shm import DATA_OFFSET, parallel_copy

    offsets, total = _layout(meta["sizes"])
    try:
        write_chunks(progress, seg.view, buffers, offsets, total, DATA_OFFSET, parallel_copy)
    except BaseException:
        progress.fail()
        raise


def _read_segment(link, meta: dict, out, targets, refusal, state, feeder: str, sharing: bool, me: str,
                  deadline: float) -> tuple:
    """Take the segment the source writes the payload into, and fill the destination from it as the source's
    progress allows (by ``deadline``); ``(result, refusal, kept)`` as ``broadcast_receiver._receive_payload``
    returns them.  Raises ``broadcast_progress.SourceGone`` if the source stops before the payload is complete,
    ``TimeoutError`` at the deadline."""
    import numpy as np  # imported here: a process that never broadcasts does not load it
    from ...transports.shm import DATA_OFFSET, map_private, parallel_copy

    sizes = meta["sizes"]
    offsets, total = _layout(sizes)
    gen = meta.get("gen")
    fds = link.take_fds()
    if not fds:
        raise ConnectionError("the shared-memory segment arrived without its descriptor")
    try:
        if refusal is not None:
            return None, refusal, False
        if targets is None:  # zero copies: views of a copy-on-write mapping, once the whole payload is there
            buf = map_private(fds[0], meta["segment"])
            Progress(buf).wait(gen, total, deadline, link)
            state.lend(feeder, meta.get("token"), buf)  # the source rewrites it only once the views are gone
            whole = np.frombuffer(buf, dtype=np.uint8)[DATA_OFFSET:]
            buffers = [whole[off : off + n] for off, n in zip(offsets, sizes)]
            return codec.decode(meta["header"], buffers), None, True
        mapping = state.shared_mapping(feeder, meta.get("uid"), fds[0], meta["segment"])
        whole = np.frombuffer(mapping, dtype=np.uint8)[DATA_OFFSET:]
        progress = Progress(mapping)
        moved = False
        if sharing:  # no copy: out's tensors move onto the segment; only the ones torch cannot move are copied
            progress.wait(gen, total, deadline, link)  # they must never show a partly written payload
            left, moved = _share(out, meta, mapping, [DATA_OFFSET + off for off in offsets], state, feeder, me)
            targets = [[] for _ in sizes]
            _unshare([t for _i, t in left])
            for i, t in left:
                targets[i].append(np.frombuffer(codec.tensor_bytes(t), dtype=np.uint8))
        # several readers on one host share its cores already: each copies on its own thread then
        copy = parallel_copy if meta.get("readers", 1) == 1 else np.copyto
        read_chunks(progress, gen, whole, offsets, sizes, targets, copy, deadline, link)
        return out, None, moved
    finally:
        for fd in fds:
            os.close(fd)
