"""The Ray actor that hosts one worker: a thin shell around core's ``WorkerHost``.

For each worker class the actor class gets one Ray method per public worker
method, so a group call costs what a raw actor call costs: the user's
arguments travel as they are, with no extra envelope.

A worker class with ``async def`` methods becomes a Ray *async* actor: every
forwarder is a coroutine awaiting ``WorkerHost.execute_async`` on the actor's
one event loop, so calls run concurrently and tasks outlive the call that
created them, exactly as in a hand-written Ray async actor.

A call that wrote to stdout or stderr ends with a mark on each stream it
wrote to, and its result travels wrapped with the mark (``logs.after_call``):
the driver prints the call's lines before it returns the call's results.
"""

from __future__ import annotations

import functools
from typing import Iterable

import ray

from rlinf.scheduler.base import worker_logging
from rlinf.scheduler.runtime.host import WorkerHost

from . import exits, logs, returns
from .classes import share_class_tracker

share_class_tracker()  # results and arguments keep the driver's classes
after_call = logs.after_call


class RayWorkerActor:
    def __init__(self):
        self._rlinf_host = WorkerHost()
        returns.install()  # a return value that cannot be pickled is named (see ``returns``)
        exits.install()  # os._exit(code) leaves its code for the driver (see ``exits``)
        worker_logging.launcher_names_lines = True  # Ray's prefix names the worker (``logs.name_worker``)
        logs.baseline()  # what Ray wrote as the actor started is no call's output

    def _rlinf_reserve_master_port(self) -> int:
        return self._rlinf_host.reserve_master_port()

    def _rlinf_construct(self, spec, payload, master_port):
        logs.name_worker(f"{spec.address.get_name()} node {spec.node.node_rank}")
        return after_call(self._rlinf_host.construct(spec, payload, master_port, "ray", ray.util.get_node_ip_address()))

    def _rlinf_execute(self, method, args, kwargs):
        return returns.expect(after_call(self._rlinf_host.execute(method, args, kwargs)), method)

    def _rlinf_ping(self):
        return self._rlinf_host.ping()


def _forwarder(name: str):
    def call(self, *args, **kwargs):
        return returns.expect(after_call(self._rlinf_host.execute(name, args, kwargs)), name)

    call.__name__ = name
    return call


def _async_forwarder(name: str):
    async def call(self, *args, **kwargs):
        return returns.expect(after_call(await self._rlinf_host.execute_async(name, args, kwargs)), name)

    call.__name__ = name
    return call


async def _async_execute(self, method, args, kwargs):
    return returns.expect(after_call(await self._rlinf_host.execute_async(method, args, kwargs)), method)


#: Ray's default for async actors, kept when the group does not say
ASYNC_MAX_CONCURRENCY = 1000


def actor_class(worker_cls_name: str, methods: Iterable[str], is_async: bool = False):
    """A Ray actor class exposing ``methods`` of the hosted worker as its own (async ones for an async worker).

    One per shape: groups of the same class (and a relaunched group) reuse it,
    so Ray exports its definition once, not at every launch."""
    return _actor_class(worker_cls_name, tuple(sorted(set(methods))), is_async)


@functools.lru_cache(maxsize=256)
def _actor_class(worker_cls_name: str, methods: tuple, is_async: bool):
    make = _async_forwarder if is_async else _forwarder
    attrs = {name: make(name) for name in methods if not name.startswith("_") and not hasattr(RayWorkerActor, name)}
    if is_async:
        attrs["_rlinf_execute"] = _async_execute
    cls = type(f"Rlinf_{worker_cls_name}{'_async' if is_async else ''}", (RayWorkerActor,), attrs)
    cls.__module__ = __name__
    return ray.remote(cls)


def actor_max_concurrency(is_async: bool, requested) -> int:
    """Ray's ``max_concurrency`` for the group's actors: what ``launch`` asked for, else Ray's default."""
    if requested is not None:
        return requested
    return ASYNC_MAX_CONCURRENCY if is_async else 1
