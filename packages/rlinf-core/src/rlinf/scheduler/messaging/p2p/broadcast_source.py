"""The source of a broadcast: encode the payload once, hand it to the receivers it feeds, collect their acks.

``_serve`` waits for the receivers the plan (``broadcast_plan``) gives the
source (``broadcast_links``), encodes the object (``broadcast_payload``),
hands a segment to the receivers on its host and writes the payload into
it once, chunk by chunk, as they copy it out (``broadcast_shm``), and
streams it to the first of the chain (``broadcast_chain``), on a thread of its own, at the same time.  It then
collects every acknowledgement and raises, naming each receiver that did
not get the payload.  Objects holding device tensors take the
point-to-point path instead (``_serve_p2p``: one send per receiver).
"""

from __future__ import annotations

import threading
import time
from typing import Optional

from ...base.hooks import hook
from .broadcast_chain import _stream
from .broadcast_links import _Child, _failure, _raise, _State
from .broadcast_payload import _describe, _dumps, _layout, _Payload, encode
from .broadcast_plan import _chunk_for
from .broadcast_progress import PIPELINED
from .broadcast_shm import _fill_segment, _open_segment


def _serve(comm, state: _State, obj, members, src, parent, deadline: float, timeout: float, fallback: bool,
           payload: Optional[_Payload] = None):
    children = [_Child(comm, r) for r in members if r != src and parent[r.get_name()] == src]
    for c in children:
        c.join(state, deadline)
    if fallback:
        return _serve_p2p(comm, obj, members, src, children, deadline, timeout)
    try:
        if payload is None:
            payload = encode(obj)
    except Exception as exc:
        abort = _dumps({"form": "abort", "text": f"{comm.name} could not serialize the {_describe(obj)} it "
                                                  f"broadcast: {type(exc).__name__}: {exc}"})
        for c in children:
            c.send([abort], deadline)
        raise TypeError(f"{comm.name}: cannot broadcast {_describe(obj)}: {exc}") from exc
    meta, buffers = payload.meta, payload.buffers
    _offsets, total = _layout(meta["sizes"])
    meta["chunk"] = _chunk_for(total, sum(1 for r in members if r != src and parent[r.get_name()] != src) + 1)
    meta_bytes = _dumps(meta)
    nbytes = len(meta["header"]) + total  # the payload, as a point-to-point send counts it
    shm_children = [c for c in children if c.link is not None and getattr(c.link, "local", False)]
    stream_children = [c for c in children if c.link is not None and c not in shm_children]
    threads = [threading.Thread(target=_feed, args=(c, meta_bytes, buffers, nbytes, meta["chunk"], None, deadline),
                                name="rlinf-broadcast-send", daemon=True) for c in stream_children]
    for t in threads:
        t.start()
    seg = None
    errors = []
    try:
        if shm_children:
            # handed over first, then written: the receivers copy each chunk as soon as it is there
            seg, progress, shm_meta = _open_segment(state, meta, len(shm_children))
            if not PIPELINED:  # written whole first: the socket orders the bytes before the receivers' reads
                _fill_segment(seg, progress, meta, buffers)
            for c in shm_children:
                _feed(c, shm_meta, buffers, nbytes, meta["chunk"], seg.fd, deadline)
            if PIPELINED:
                _fill_segment(seg, progress, meta, buffers)
        for c in shm_children:
            errors += c.acknowledgement(deadline)
        if seg is not None:  # never rewritten while a receiver may still read it or holds views of it
            # reused only when every receiver said how it left it: one that failed may still map it
            state.release_segment(seg, {c.name for c in shm_children if c.kept}, reusable=not errors)
            seg = None
            comm._start_housekeeping()  # trims the pool once broadcasts stop
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()) + 5.0)  # every send in _feed ends by the deadline
        for c in children:
            if c not in shm_children:
                errors += c.acknowledgement(deadline)
    finally:  # on an unexpected error: receivers see their link close at once, the segment is not reused
        if seg is not None:
            seg.close()
        for c in children:
            if c.link is not None:
                c.link.close()
    _raise(comm, errors, timeout)
    return obj


@hook("broadcast_feed")
def _feed(child: _Child, meta_bytes: bytes, buffers: list, nbytes: int, chunk: int, fd: Optional[int],
          deadline: float) -> None:
    """Give ``child`` the payload (``nbytes``: header and buffers): the segment it was written to (``fd``, a receiver on
    this host), or the stream of its chunks.  Failures stay on the child (``_Child.error``)."""
    if fd is not None:
        child.send_fds([meta_bytes], [fd], deadline)
        return
    _stream(child, meta_bytes, buffers, chunk, deadline)


def _serve_p2p(comm, obj, members, src, children, deadline: float, timeout: float):
    """Objects holding device tensors: every receiver gets its copy point to point (device links)."""
    note = _dumps({"form": "p2p"})
    for c in children:
        c.send([note], deadline)
    left = max(0.001, deadline - time.monotonic())
    errors = []
    works = [(r, comm.send_object(obj, r, "cpu", left, True)) for r in members if r != src]
    for r, w in works:
        try:
            w.wait(max(0.001, deadline - time.monotonic()) + 5.0)  # the send itself ends by the deadline
        except Exception as exc:
            errors.append(_failure(comm, r.get_name(), r, exc, "sending to"))
    for c in children:
        errors += c.acknowledgement(deadline)
    _raise(comm, errors, timeout)
    return obj
