"""The recording wrappers put on the hook points while tracing is on.

``make(kind, fn)`` returns a function with ``fn``'s signature that calls
``fn`` and appends an event to the recorder.  One kind per hook point
(see the ``@hook`` marks in group.py, host.py, timing.py, p2p and channel).
"""

from __future__ import annotations

import contextlib
import functools
import itertools

from ..messaging.channel.keys import plain_key
from . import recorder as _recorder
from .recorder import _local, clock, record, what

#: names of control calls that must not show up as the user's work
_CONTROL_PREFIX = "_rlinf_trace"
_call_ids = itertools.count(1)

#: channel method -> (index of ``key``, index of ``async_op`` or None) among its positional arguments (after self)
_CHANNEL_ARGS = {"put": (2, 3), "put_nowait": (2, None), "get": (0, 1), "get_nowait": (0, None),
                 "get_batch": (1, 2)}


def _arg(args, kwargs, index, name, default=None):
    if name in kwargs:
        return kwargs[name]
    return args[index] if index is not None and len(args) > index else default


def _on_done(work, name: str, cat: str, start: int, args: dict) -> None:
    """Record an asynchronous span from ``start`` until ``work`` (an ``AsyncWork``) completes."""
    future = getattr(work, "_future", None)
    if future is None:
        return

    def done(fut):
        a = dict(args)
        if fut.cancelled() or fut.exception() is not None:
            a["error"] = "cancelled" if fut.cancelled() else type(fut.exception()).__name__
        record("A", name, cat, start, clock(), a)

    future.add_done_callback(done)


# -- group calls (driver side) ------------------------------------------------------
def _group_call(fn):
    @functools.wraps(fn)
    def traced_call(self, method, args, kwargs):
        start = clock()
        result = fn(self, method, args, kwargs)
        end = clock()
        name = f"{self._name}.{method}"
        ranks = result._ranks
        record("X", f"submit {name}", "group", start, end, {"group": self._name, "method": method, "ranks": list(ranks)})
        result._rlinf_trace = (start, next(_call_ids))
        return result

    return traced_call


def _group_result(fn):
    @functools.wraps(fn)
    def traced_finish(self, outcomes):
        mark = getattr(self, "_rlinf_trace", None)
        error = None
        try:
            return fn(self, outcomes)
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            if mark is not None:
                args = {"group": self._group._name, "method": self._method, "ranks": list(self._ranks), "call": mark[1]}
                if error is not None:
                    args["error"] = error
                record("A", f"{self._group._name}.{self._method}", "group_call", mark[0], clock(), args)

    return traced_finish


def _group_stop(fn):
    @functools.wraps(fn)
    def traced_stop(self):
        if getattr(self, "_session", None) is not None:
            from . import collect

            collect.keep_group_before_stop(self)  # bounded; its processes and their events end with the stop
        return fn(self)

    return traced_stop


def _cluster_shutdown(fn):
    @functools.wraps(fn)
    def traced_shutdown(self):
        from . import collect

        collect.keep_all_before_shutdown(self)  # bounded
        return fn(self)

    return traced_shutdown


# -- method runs (worker side) -------------------------------------------------------
def _run(fn):
    @functools.wraps(fn)
    def traced_execute(self, method, args, kwargs):
        if self.is_async or method.startswith(_CONTROL_PREFIX):  # execute_async records async workers' calls
            return fn(self, method, args, kwargs)
        start = clock()
        try:
            return fn(self, method, args, kwargs)
        finally:
            record("X", method, "run", start, clock(), None)

    return traced_execute


def _run_async(fn):
    @functools.wraps(fn)
    async def traced_execute_async(self, method, args, kwargs):
        if method.startswith(_CONTROL_PREFIX):
            return await fn(self, method, args, kwargs)
        start = clock()
        try:
            return await fn(self, method, args, kwargs)
        finally:
            record("A", method, "run", start, clock(), {"call": next(_call_ids)})

    return traced_execute_async


# -- timers ------------------------------------------------------------------------------
def _timer(fn):
    @contextlib.contextmanager
    def traced_timed(tag):
        start = clock()
        try:
            with fn(tag):
                yield
        finally:
            record("X", tag, "timer", start, clock(), None)

    functools.update_wrapper(traced_timed, fn)
    return traced_timed


# -- point-to-point ------------------------------------------------------------------------
# The spans are recorded where the bytes move (the communicator's send and receive on a
# link), in the thread that moves them: the caller's for a blocking operation, the pair's
# runner thread for ``async_op=True``.  Their args are scalars (peer name, bytes, transport,
# error), named at dump time (``recorder.ARG_NAMES``): an event tuple of them is one the
# garbage collector stops tracking at its first pass (see recorder.py).
#
# These two run on every traced message, so their success path does what ``record`` does
# written out, in as few steps as it takes: on a small round trip, each step there costs
# several times what it costs in a loop (caches are cold between messages; a test or a global
# lookup dropped from each of the four events of a round trip shows in its time; the buffer's
# limit is kept by the recorder's trimmer, not tested here).  They hold
# the buffer and its ``append``: a drain empties it in place, and it is replaced only while
# tracing is off (``recorder.enable``, at a new size), before new wrappers are made; a drain
# also empties the buffers it replaced, where an operation in flight across the switch records.
def _nbytes(frames) -> int:
    total = 0
    for f in frames:
        t = type(f)
        total += len(f) if t is bytes or t is bytearray else f.nbytes if t is memoryview else memoryview(f).nbytes
    return total


_SEND, _SEND_TENSOR, _RECV = what("X", "send", "p2p"), what("X", "send_tensor", "p2p"), what("X", "recv", "p2p")


def _p2p_send(fn):
    append = _recorder._events.append

    @functools.wraps(fn)
    def traced_send_frames(self, peer, transport, frames, deadline, raw=False):
        start = clock()
        try:
            fn(self, peer, transport, frames, deadline, raw)
        except BaseException as exc:
            record("X", "send_tensor" if raw else "send", "p2p", start, clock(), peer._name,
                   _nbytes(frames[1:] if raw else frames), transport, type(exc).__name__)
            raise
        if raw:
            append((_SEND_TENSOR, start, clock(), _local.thread, peer._name, _nbytes(frames[1:]), transport))
        else:  # a small object is its header (bytes) alone
            append((_SEND, start, clock(), _local.thread, peer._name,
                    len(frames[0]) if len(frames) == 1 and type(frames[0]) is bytes else _nbytes(frames), transport))

    return traced_send_frames


def _p2p_recv(fn):
    append = _recorder._events.append

    @functools.wraps(fn)
    def traced_receive(self, peer, transport, deadline, read):
        start = clock()
        try:
            result = fn(self, peer, transport, deadline, read)
        except BaseException as exc:
            record("X", "recv", "p2p", start, clock(), peer._name, None, transport, type(exc).__name__)
            raise
        if type(result) is tuple:  # (raw, frames) of a recv; recv_tensor's read returns a flag (recorded there)
            frames = result[1]
            append((_RECV, start, clock(), _local.thread, peer._name,
                    len(frames[0]) if len(frames) == 1 and type(frames[0]) is bytearray else _nbytes(frames), transport))
        return result

    return traced_receive


def _p2p_async(fn):
    """``send``/``recv``/``send_tensor`` with ``async_op=True`` (the communicator's ``_submit``): a span from
    the call until the work completes (the bytes are on the transfer's own span, on the runner thread).
    Blocking operations do not pass here, so they pay for no wrapper beyond their transfer's."""

    @functools.wraps(fn)
    def traced_submit(self, pair, ticket, op, deadline, kind, peer, timeout):
        if kind == "recv_tensor":  # its span, with the tensor's size, comes from recv_tensor's own hook
            return fn(self, pair, ticket, op, deadline, kind, peer, timeout)
        start = clock()
        work = fn(self, pair, ticket, op, deadline, kind, peer, timeout)
        _on_done(work, f"{kind} (async)", "p2p", start, {"peer": peer._name})
        return work

    return traced_submit


def _p2p_recv_tensor(fn):
    """``recv_tensor``: the receiver knows the size up front; a span until the tensor is filled."""
    from ..messaging.p2p.communicator import local_communicator

    @functools.wraps(fn)
    def traced_recv_tensor(tensor, src_group_name, src_rank, async_op=False, options=None, timeout=None):
        start = clock()
        peer = f"{src_group_name}:{src_rank}"
        if async_op:
            work = fn(tensor, src_group_name, src_rank, async_op, options, timeout)
            _on_done(work, "recv_tensor (async)", "p2p", start, {"peer": peer, "bytes": tensor.nbytes})
            return work
        error = None
        try:
            return fn(tensor, src_group_name, src_rank, async_op, options, timeout)
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            comm = local_communicator()
            requested = options.transport if options is not None else None
            try:
                transport = comm.transport_name(requested) if comm is not None else requested
            except Exception:  # an unknown transport: the call itself said so
                transport = requested
            record("X", "recv_tensor", "p2p", start, clock(), peer, tensor.nbytes, transport, error)

    return traced_recv_tensor


def _broadcast(fn):
    @functools.wraps(fn)
    def traced_broadcast(obj=None, groups=None, src=None, async_op=False, options=None, timeout=None, out=None,
                         share_memory=False):
        start = clock()
        args = {"src": f"{src[0]}:{src[1]}" if src else None, "groups": repr(groups)}
        if async_op:
            work = fn(obj, groups, src, async_op, options, timeout, out, share_memory)
            _on_done(work, "broadcast (async)", "p2p", start, args)
            return work
        try:
            return fn(obj, groups, src, async_op, options, timeout, out, share_memory)
        finally:
            record("X", "broadcast", "p2p", start, clock(), args)

    return traced_broadcast


# The parts of a ``cpu`` broadcast (broadcast.py) that move its payload, on their own links:
# inside the broadcast's span, a source's hand-over to each receiver it feeds, and a receiver's
# take from its feeder (a relay in a chain passes each chunk on as it takes it: its send spans
# its take).  Peer, bytes (the whole payload) and transport, as for point-to-point spans.
def _child_error(child):
    return child.error["kind"] if child is not None and child.error else None


def _broadcast_feed(fn):
    @functools.wraps(fn)
    def traced_feed(child, meta_bytes, buffers, nbytes, chunk, fd, deadline):
        start = clock()
        try:
            return fn(child, meta_bytes, buffers, nbytes, chunk, fd, deadline)
        finally:
            record("X", "broadcast send", "p2p", start, clock(), child.name, nbytes, "cpu", _child_error(child))

    return traced_feed


def _broadcast_take(fn):
    @functools.wraps(fn)
    def traced_take(link, meta, child, out, me, deadline, state, feeder, share_memory=False):
        start = clock()
        error = None
        try:
            result = fn(link, meta, child, out, me, deadline, state, feeder, share_memory)
            if result[1] is not None:  # refused (``out`` does not fit): the payload was still relayed
                error = type(result[1]).__name__
            return result
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            end = clock()
            nbytes = len(meta["header"]) + sum(meta["sizes"])
            record("X", "broadcast recv", "p2p", start, end, feeder, nbytes, "cpu", error)
            if child is not None and "segment" not in meta:
                record("X", "broadcast send", "p2p", start, end, child.name, nbytes, "cpu", _child_error(child))

    return traced_take


# -- channels ----------------------------------------------------------------------------------
def _plain_key(key) -> str:
    """The key as the timeline labels it (``default_queue``, ``('a', 1)``); an unhashable one, which the call
    itself refuses, as its repr."""
    try:
        return plain_key(key)
    except TypeError:
        return repr(key)


def _channel(fn):
    key_at, async_at = _CHANNEL_ARGS[fn.__name__]
    name = fn.__name__

    @functools.wraps(fn)
    def traced_channel(self, *args, **kwargs):
        key = _arg(args, kwargs, key_at, "key", "default_queue")
        info = {"channel": self._name, "key": _plain_key(key)}
        start = clock()
        if async_at is not None and _arg(args, kwargs, async_at, "async_op", False):
            work = fn(self, *args, **kwargs)
            _on_done(work, f"channel.{name} (async)", "channel", start, info)
            return work
        try:
            return fn(self, *args, **kwargs)
        except BaseException as exc:
            info["error"] = type(exc).__name__
            raise
        finally:
            end = clock()
            info["wait_ms"] = round((end - start) / 1e6, 3)
            record("X", f"channel.{name}", "channel", start, end, info)

    return traced_channel


_FACTORIES = {
    "group_call": _group_call,
    "group_result": _group_result,
    "group_stop": _group_stop,
    "cluster_shutdown": _cluster_shutdown,
    "run": _run,
    "run_async": _run_async,
    "timer": _timer,
    "p2p_send": _p2p_send,
    "p2p_recv": _p2p_recv,
    "p2p_recv_tensor": _p2p_recv_tensor,
    "p2p_async": _p2p_async,
    "broadcast": _broadcast,
    "broadcast_feed": _broadcast_feed,
    "broadcast_take": _broadcast_take,
    "channel": _channel,
}


def make(kind: str, fn):
    """The recording wrapper of hook point ``fn`` of this ``kind``."""
    wrapper = _FACTORIES[kind](fn)
    wrapper.__wrapped__ = fn
    return wrapper


_recorder.provide_wrappers(make)
