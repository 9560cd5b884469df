"""The recording wrappers put on the hook points while tracing is on.

``make(kind, fn)`` returns a function with ``fn``'s signature that calls
``fn`` and appends an event to the recorder.  One kind per hook point
(see the ``@hook`` marks in group.py, host.py, timing.py, p2p and channel).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading

from .recorder import clock, record

#: names of control calls that must not show up as the user's work
_CONTROL_PREFIX = "_rlinf_trace"
_tl = threading.local()
_call_ids = itertools.count(1)

#: communicator ``what`` -> the public operation it serves
_P2P_NAMES = {"sending to": "send", "receiving from": "recv", "sending a tensor to": "send_tensor",
              "receiving a tensor from": "recv_tensor"}
#: public p2p function -> (index of the peer's group name, index of ``async_op``) among its positional arguments
_P2P_ARGS = {"send": (1, 3), "recv": (0, 2), "send_tensor": (1, 3), "recv_tensor": (1, 3)}
#: channel method -> (index of ``key``, index of ``async_op`` or None) among its positional arguments (after self)
_CHANNEL_ARGS = {"put": (2, 3), "put_nowait": (2, None), "get": (0, 1), "get_nowait": (0, None),
                 "get_batch": (1, 2)}


def _nbytes(frames) -> int:
    total = 0
    for f in frames:
        try:
            total += memoryview(f).nbytes
        except TypeError:
            total += len(f)
    return total


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
def _p2p_op(fn):
    """``Communicator._guarded``: one operation, in the thread that runs it, with its bytes."""

    @functools.wraps(fn)
    def traced_guarded(self, pair, ticket, op, deadline, what, peer, timeout):
        name = _P2P_NAMES.get(what, what)
        _tl.bytes = 0
        start = clock()
        error = None
        result = None
        try:
            result = fn(self, pair, ticket, op, deadline, what, peer, timeout)
            return result
        except BaseException as exc:
            error = type(exc).__name__
            raise
        finally:
            end = clock()
            nbytes = _tl.bytes
            if name == "recv_tensor" and result is not None:
                nbytes = result.nbytes
            args = {"peer": peer.get_name(), "bytes": nbytes, "transport": pair.transport}
            if error is not None:
                args["error"] = error
            record("X", name, "p2p", start, end, args)

    return traced_guarded


def _p2p_bytes_out(fn):
    @functools.wraps(fn)
    def traced_send_frames(self, peer, transport, frames, deadline, raw=False):
        fn(self, peer, transport, frames, deadline, raw)
        _tl.bytes = getattr(_tl, "bytes", 0) + _nbytes(frames[1:] if raw else frames)

    return traced_send_frames


def _p2p_bytes_in(fn):
    @functools.wraps(fn)
    def traced_receive(self, peer, transport, deadline, read):
        result = fn(self, peer, transport, deadline, read)
        if type(result) is tuple and len(result) == 2:  # (raw, frames) of a recv; recv_into returns a flag
            _tl.bytes = getattr(_tl, "bytes", 0) + _nbytes(result[1])
        return result

    return traced_receive


def _p2p_async(fn):
    """A public p2p function: with ``async_op=True``, a span from the call until the work completes."""
    peer_at, async_at = _P2P_ARGS[fn.__name__]
    name = fn.__name__

    @functools.wraps(fn)
    def traced_p2p(*args, **kwargs):
        if not _arg(args, kwargs, async_at, "async_op", False):
            return fn(*args, **kwargs)
        start = clock()
        work = fn(*args, **kwargs)
        group = _arg(args, kwargs, peer_at, "dst_group_name" if name.startswith("send") else "src_group_name")
        rank = _arg(args, kwargs, peer_at + 1, "dst_rank" if name.startswith("send") else "src_rank")
        _on_done(work, f"{name} (async)", "p2p", start, {"peer": f"{group}:{rank}"})
        return work

    return traced_p2p


def _broadcast(fn):
    @functools.wraps(fn)
    def traced_broadcast(obj=None, groups=None, src=None, async_op=False, options=None, timeout=None):
        start = clock()
        args = {"src": f"{src[0]}:{src[1]}" if src else None, "groups": repr(groups)}
        if async_op:
            work = fn(obj, groups, src, async_op, options, timeout)
            _on_done(work, "broadcast (async)", "p2p", start, args)
            return work
        try:
            return fn(obj, groups, src, async_op, options, timeout)
        finally:
            record("X", "broadcast", "p2p", start, clock(), args)

    return traced_broadcast


# -- channels ----------------------------------------------------------------------------------
def _channel(fn):
    key_at, async_at = _CHANNEL_ARGS[fn.__name__]
    name = fn.__name__

    @functools.wraps(fn)
    def traced_channel(self, *args, **kwargs):
        key = _arg(args, kwargs, key_at, "key", "default_queue")
        info = {"channel": self._name, "key": repr(key)}
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
    "p2p_op": _p2p_op,
    "p2p_bytes_out": _p2p_bytes_out,
    "p2p_bytes_in": _p2p_bytes_in,
    "p2p_async": _p2p_async,
    "broadcast": _broadcast,
    "channel": _channel,
}


def make(kind: str, fn):
    """The recording wrapper of hook point ``fn`` of this ``kind``."""
    wrapper = _FACTORIES[kind](fn)
    wrapper.__wrapped__ = fn
    return wrapper
