"""The chain: a broadcast's payload streamed in chunks, each receiver passing every chunk on as it has it.

Receivers on other hosts than the source form a chain, grouped by host
(``broadcast_plan``): each connects to its predecessor (the source for the
first), receives the payload in chunks (sized by
``broadcast_plan._chunk_for``) straight into its destination (its own
socket, no read-ahead copy, ``_relay``) and forwards every chunk to its
successor as soon as it has it, so the whole takes about one transfer plus
a chunk per hop, however long the chain.  The source streams its buffers
(``_stream``) to the first.
"""

from __future__ import annotations

from ...transports import codec
from .broadcast_payload import _layout


def _stream(child, meta_bytes: bytes, buffers: list, chunk: int, deadline: float) -> None:
    """Send ``child`` the payload's description, then its buffers in chunks; failures stay on the child."""
    child.send([meta_bytes], deadline)
    for b in buffers:
        for pos in range(0, b.nbytes, chunk):
            if child.link is None:
                return
            child.send([b[pos : pos + chunk]], deadline)


def _relay(link, meta: dict, child, out, targets, refusal, deadline: float) -> tuple:
    """Receive the payload's chunks into the destination, passing each on to ``child`` (if any) as it
    arrives; ``(result, refusal, kept)`` as ``broadcast_receiver._receive_payload`` returns them."""
    import numpy as np  # imported here: a process that never broadcasts does not load it

    sizes = meta["sizes"]
    offsets, total = _layout(sizes)
    flat = None
    if targets is None and refusal is None:
        flat = np.empty(total, dtype=np.uint8)
        targets = [[flat[off : off + n]] if n else [] for off, n in zip(offsets, sizes)]
    chunk = meta["chunk"]
    scratch = None
    for i, n in enumerate(sizes):
        dsts = [d for d in targets[i] if d is not None] if refusal is None else []
        for pos in range(0, n, chunk):
            m = min(chunk, n - pos)
            if dsts:
                first = dsts[0][pos : pos + m]
            else:  # refused: still take it off the wire and pass it on
                if scratch is None:
                    scratch = np.empty(chunk, dtype=np.uint8)
                first = scratch[:m]
            link.recv_into([first], deadline)
            if child is not None:
                child.send([first], deadline)
            for extra in dsts[1:]:
                np.copyto(extra[pos : pos + m], first)
    if refusal is not None:
        return None, refusal, False
    if out is not None:
        return out, None, False
    buffers = [flat[off : off + n] for off, n in zip(offsets, sizes)]
    return codec.decode(meta["header"], buffers), None, False

