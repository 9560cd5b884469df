"""The Ray actor that hosts one worker: a thin shell around core's ``WorkerHost``."""

from __future__ import annotations

import ray

from rlinf.scheduler.host import WorkerHost


class RayWorkerActor:
    def __init__(self):
        self._host = WorkerHost()

    def reserve_master_port(self) -> int:
        return self._host.reserve_master_port()

    def construct(self, spec, payload, master_port):
        return self._host.construct(spec, payload, master_port, "ray", ray.util.get_node_ip_address())

    def execute(self, method, args, kwargs):
        return self._host.execute(method, args, kwargs)

    def ping(self):
        return self._host.ping()


RemoteWorkerActor = ray.remote(RayWorkerActor)
