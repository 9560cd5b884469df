"""The Ray actor that hosts one worker: a thin shell around core's ``WorkerHost``.

For each worker class the actor class gets one Ray method per public worker
method, so a group call costs what a raw actor call costs: the user's
arguments travel as they are, with no extra envelope.
"""

from __future__ import annotations

from typing import Iterable

import ray

from rlinf.scheduler.host import WorkerHost

from .classes import share_class_tracker

share_class_tracker()  # results and arguments keep the driver's classes


class RayWorkerActor:
    def __init__(self):
        self._rlinf_host = WorkerHost()

    def _rlinf_reserve_master_port(self) -> int:
        return self._rlinf_host.reserve_master_port()

    def _rlinf_construct(self, spec, payload, master_port):
        return self._rlinf_host.construct(spec, payload, master_port, "ray", ray.util.get_node_ip_address())

    def _rlinf_execute(self, method, args, kwargs):
        return self._rlinf_host.execute(method, args, kwargs)

    def _rlinf_ping(self):
        return self._rlinf_host.ping()


def _forwarder(name: str):
    def call(self, *args, **kwargs):
        return self._rlinf_host.execute(name, args, kwargs)

    call.__name__ = name
    return call


def actor_class(worker_cls_name: str, methods: Iterable[str]):
    """A Ray actor class exposing ``methods`` of the hosted worker as its own."""
    attrs = {name: _forwarder(name) for name in methods if not name.startswith("_") and not hasattr(RayWorkerActor, name)}
    cls = type(f"Rlinf_{worker_cls_name}", (RayWorkerActor,), attrs)
    cls.__module__ = __name__
    return ray.remote(cls)
