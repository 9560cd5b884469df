"""A receiver of a broadcast: connect upstream, take the payload, pass it on, acknowledge.

``_receive`` connects to the worker that feeds it (``broadcast_links``),
reads the payload's description and passes it on to the receiver it feeds
in the chain, if any.  ``_receive_payload`` checks ``out=`` against the
description (``broadcast_out``) and fills the destination from the
shared-memory segment (``broadcast_shm``) or from the stream, relaying each
chunk (``broadcast_chain``).  The acknowledgement then goes back up,
carrying the failures seen below (its own refusal of ``out=`` first).
"""

from __future__ import annotations

import pickle
import time
from typing import Optional

from ...base.errors import CommunicationError
from ...base.hooks import hook
from .broadcast_chain import _relay
from .broadcast_links import _Child, _error_class, _failure, _State
from .broadcast_out import _targets_for_out, copy_into
from .broadcast_shm import _read_segment


def _receive(comm, state: _State, me_addr, members, src, parent, child_of, out, deadline: float, timeout: float,
             share_memory: bool = False):
    me = comm.name
    feeder = parent[me]
    try:
        link = state.connect(comm, feeder, deadline)
    except Exception as exc:
        err = _failure(comm, feeder.get_name(), feeder, exc, "connecting to")
        raise _error_class({err["kind"]})(f"{me}: broadcast: {err['text']}", peer=feeder.get_name()) from None
    child = _Child(comm, child_of[me]) if me in child_of else None
    own_error: Optional[BaseException] = None
    result = None
    kept = False
    try:
        try:
            _raw, frames = link.recv(deadline)
            meta = pickle.loads(bytes(frames[0]))  # an authenticated link (see _Child.acknowledgement)
            form = meta["form"]
            if child is not None:
                child.join(state, deadline)
                child.send([frames[0]], deadline)
            if form == "abort":
                raise CommunicationError(f"{me}: broadcast: {meta['text']}", peer=src.get_name())
            if form == "p2p":
                left = max(0.001, deadline - time.monotonic())
                result = comm.recv_object(src, "cpu", left, False)
                if out is not None:
                    try:
                        result = copy_into(result, out, me)
                    except (TypeError, ValueError) as exc:
                        result, own_error = None, exc
            else:
                result, own_error, kept = _receive_payload(link, meta, child, out, me, deadline, state,
                                                           feeder.get_name(), share_memory)
                if state.mapped:
                    comm._start_housekeeping()  # drops the kept mapping once this feeder goes quiet
        except Exception as exc:  # the feeder failed us: nothing to acknowledge to
            state.forget_mapping(feeder.get_name())
            err = _failure(comm, feeder.get_name(), feeder, exc, "receiving the broadcast from")
            if child is not None and child.link is not None:
                child._fail(ConnectionError("the broadcast broke off upstream"), "feeding")
            raise _error_class({err["kind"]})(f"{me}: broadcast from {src.get_name()!r}: {err['text']}",
                                              peer=feeder.get_name()) from None
        errors = child.acknowledgement(deadline) if child is not None else []
        if own_error is not None:
            errors.insert(0, {"who": me, "kind": "refused", "text": str(own_error)})
        try:
            link.send([pickle.dumps({"errors": errors, "kept": kept})], deadline)
        except Exception:
            pass  # the feeder is gone: it reports that itself
    finally:
        link.close()
    if own_error is not None:
        raise own_error
    return result


@hook("broadcast_take")
def _receive_payload(link, meta: dict, child: Optional[_Child], out, me: str, deadline: float, state: _State,
                     feeder: str, share_memory: bool = False):
    """Fill the destination from shared memory or from the stream; ``(result, refusal, kept)``.

    ``kept``: the result holds views of the source's segment (copy-on-write), or ``out``'s tensors were
    moved onto it (``share_memory``).
    """
    refusal = None
    targets = None
    sharing = share_memory and "segment" in meta
    if out is not None:
        try:
            targets = _targets_for_out(out, meta, me, private=not sharing)
        except (TypeError, ValueError) as exc:
            refusal = exc
    if "segment" in meta:  # the source wrote it once into a segment we share
        return _read_segment(link, meta, out, targets, refusal, state, feeder, sharing, me, deadline)
    return _relay(link, meta, child, out, targets, refusal, deadline)
