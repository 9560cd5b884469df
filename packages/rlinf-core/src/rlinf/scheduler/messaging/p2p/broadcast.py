"""``broadcast``: one source, many receivers, the payload written once.

The path of a payload, top-down:

1. ``broadcast`` (here) takes this process's turn (broadcasts of one process
   run one at a time, in call order) and derives the plan, alike on every
   participant (``broadcast_plan``): receivers on the source's host are fed
   by the source through shared memory, the others form a chain by host.
2. The source (``broadcast_source``) waits for the receivers it feeds, which
   connect to it (``broadcast_links``), and encodes the object once
   (``broadcast_payload``).
3. It hands a ``memfd`` segment from its pool (``broadcast_shm``,
   ``broadcast_lending``) to each receiver on its host, then writes the
   payload once into it, publishing its progress (``broadcast_progress``);
   a receiver copies each part out as it is written, or, once it is all
   there, maps it as views or moves its ``out=`` tensors onto it
   (``broadcast_out``).
4. At the same time it streams the payload in chunks to the first of the
   chain, and every receiver there takes each chunk straight into its
   destination and passes it on (``broadcast_chain``).
5. Each receiver (``broadcast_receiver``) acknowledges up its link, carrying
   the failures seen below; the source raises, naming each receiver that
   did not get the payload (``broadcast_links``).  A segment a receiver
   keeps views of is lent until it reports them gone (``broadcast_lending``).

A small payload (at most ``RLINF_BROADCAST_EAGER_KB``, default 1024) is
copied and served in the background (``broadcast_payload._eager_payload``),
so the source returns at once, as a point-to-point ``send`` does, even if no
receiver has called ``broadcast`` yet; a failure then (a receiver that never
comes within the timeout) is logged on the source.  A larger one waits for
its receivers: it is written once and read in place, so it cannot be
released before they have it.  Objects holding device tensors
(``transports.device_routing``), and broadcasts through a transport other
than ``cpu``, take the point-to-point path (one send per receiver).
"""

from __future__ import annotations

import time
from typing import Optional

from ...base.errors import CommTimeoutError, CommunicationError
from ...transports import device_routing
from ...transports.async_work import AsyncWork
from .broadcast_links import SERVICE, _State
from .broadcast_out import _share, _unshare, copy_into
from .broadcast_payload import _eager_payload, _layout, encode
from .broadcast_plan import _plan
from .broadcast_receiver import _receive
from .broadcast_source import _serve

#: what importers use from here: the entry points, and the pieces tests drive on their own
__all__ = ["broadcast", "install", "copy_into", "encode", "_layout", "_State", "_share", "_unshare"]


def install(comm) -> None:
    """Give ``comm`` its broadcast state and route broadcast connections to it."""
    comm.broadcast_state = _State()
    comm.add_service(SERVICE, comm.broadcast_state.accept)


def broadcast(comm, obj, members: list, src, out, transport: Optional[str], timeout: float, async_op: bool,
              share_memory: bool = False):
    """Run one broadcast in this process's turn; ``members`` and ``src`` are addresses."""
    state = getattr(comm, "broadcast_state", None)
    if state is None:
        raise CommunicationError(f"{comm.name}: this communicator does not serve broadcasts")
    me = comm.address
    ticket = state.turnstile.take()
    plan = _plan(comm, members, src)
    fallback = False
    eager = None
    if me == src:
        fallback = device_routing.may_hold_device_tensors(obj) and device_routing.needs_device_path(obj)
        if not fallback and not async_op and len(members) > 1:
            try:
                eager = _eager_payload(obj)
            except Exception:  # _serve encodes it again, tells the receivers, and raises
                eager = None

    def op():
        deadline = time.monotonic() + timeout
        try:
            state.turnstile.wait_turn(ticket, deadline)
            parent, child = plan
            if me == src:
                return _serve(comm, state, obj, members, src, parent, deadline, timeout, fallback, eager)
            return _receive(comm, state, me, members, src, parent, child, out, deadline, timeout, share_memory)
        except TimeoutError as exc:
            if isinstance(exc, CommunicationError):
                raise
            raise CommTimeoutError(f"{comm.name}: broadcast timed out after {timeout:g} s ({exc})") from None
        finally:
            state.turnstile.done(ticket)

    if async_op:
        return AsyncWork(state.runner.submit(op), "broadcast")
    if eager is not None:
        state.runner.submit(op).add_done_callback(lambda f: _log_eager_failure(comm, f))
        return obj
    return op()


def _log_eager_failure(comm, fut) -> None:
    """A small broadcast the source already returned from failed: nobody waits on it, so say so."""
    exc = fut.exception()
    if exc is not None:
        import logging

        logging.getLogger("rlinf.broadcast").error("%s: a broadcast it returned from early failed: %s", comm.name, exc)
