"""The shared-memory fan-out: a broadcast's payload written once, read by every receiver on the source's host.

The source writes the payload once into a ``memfd`` segment from its pool
(``_write_segment``; ``broadcast_lending``) and hands that same segment to
each receiver on its host (``SocketLink.send_fds``, ``SCM_RIGHTS``).  A
receiver (``_read_segment``) with ``out=`` copies out of it (in parallel
with the others) through the mapping it keeps of its feeder's segment; one
without maps it copy-on-write and gets tensors that are views of it (zero
copies; its writes stay its own); one with ``out=`` and
``share_memory=True`` moves its tensors' storages onto it
(``broadcast_out._share``).  A segment a receiver keeps views of, or
storages on, is lent to it until they are gone.
"""

from __future__ import annotations

import os

from ...transports import codec
from .broadcast_out import _share, _unshare
from .broadcast_payload import _dumps, _layout


def _write_segment(state, meta: dict, buffers: list, readers: int) -> tuple:
    """``(segment, description)``: the payload copied once into a segment of ``state``'s pool, and the
    description (``meta`` plus the segment's size and names) the ``readers`` who map it receive first."""
    import numpy as np  # imported here: a process that never broadcasts does not load it
    from ...transports.shm import DATA_OFFSET, parallel_copy

    offsets, total = _layout(meta["sizes"])
    seg = state.acquire_segment(max(total, 1))
    try:
        for b, off in zip(buffers, offsets):
            if b.nbytes:
                parallel_copy(seg.view[DATA_OFFSET + off : DATA_OFFSET + off + b.nbytes], np.frombuffer(b, np.uint8))
        shm_meta = _dumps({**meta, "segment": DATA_OFFSET + seg.capacity, "token": seg.token, "uid": seg.uid,
                           "readers": readers})
    except BaseException:  # never reused: nobody was told of it
        seg.close()
        raise
    return seg, shm_meta


def _read_segment(link, meta: dict, out, targets, refusal, state, feeder: str, sharing: bool, me: str) -> tuple:
    """Take the segment the source wrote the payload into, and fill the destination from it;
    ``(result, refusal, kept)`` as ``broadcast_receiver._receive_payload`` returns them."""
    import numpy as np  # imported here: a process that never broadcasts does not load it
    from ...transports.shm import DATA_OFFSET, map_private, parallel_copy

    sizes = meta["sizes"]
    offsets, _total = _layout(sizes)
    fds = link.take_fds()
    if not fds:
        raise ConnectionError("the shared-memory segment arrived without its descriptor")
    try:
        if refusal is not None:
            return None, refusal, False
        if targets is None:  # zero copies: views of a copy-on-write mapping
            buf = map_private(fds[0], meta["segment"])
            state.lend(feeder, meta.get("token"), buf)  # the source rewrites it only once the views are gone
            whole = np.frombuffer(buf, dtype=np.uint8)[DATA_OFFSET:]
            buffers = [whole[off : off + n] for off, n in zip(offsets, sizes)]
            return codec.decode(meta["header"], buffers), None, True
        mapping = state.shared_mapping(feeder, meta.get("uid"), fds[0], meta["segment"])
        whole = np.frombuffer(mapping, dtype=np.uint8)[DATA_OFFSET:]
        moved = False
        if sharing:  # no copy: out's tensors move onto the segment; only the ones torch cannot move are copied
            left, moved = _share(out, meta, mapping, [DATA_OFFSET + off for off in offsets], state, feeder, me)
            targets = [[] for _ in sizes]
            _unshare([t for _i, t in left])
            for i, t in left:
                targets[i].append(np.frombuffer(codec.tensor_bytes(t), dtype=np.uint8))
        # several readers on one host share its cores already: each copies on its own thread then
        copy = parallel_copy if meta.get("readers", 1) == 1 else np.copyto
        for i, (off, n) in enumerate(zip(offsets, sizes)):
            for dst in targets[i]:
                if dst is not None:
                    copy(dst, whole[off : off + n])
        return out, None, moved
    finally:
        for fd in fds:
            os.close(fd)
