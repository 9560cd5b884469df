"""The cluster-wide group registry, a named Ray actor owned by the driver.

Any worker or the driver finds a group's workers (their info and transport
endpoints) here by group name.  Names are reserved before workers start, so
two launches can never take the same name.

Next to each record the registry keeps the group's Ray objects (its actor
handles and placement group): a process that did not launch the group can
attach to it (``WorkerGroup.from_group_name``) and stop it, and stopping
frees the group's reserved resources whoever does it.  Holding the handles
here also keeps the actors alive when the launching code drops its group.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

import ray

REGISTRY_ACTOR_NAME = "rlinf_registry"


class Registry:
    """The registry's state; every operation is atomic.

    The actor serving it is threaded (``max_concurrency``), so calls run
    concurrently: a check followed by an update must hold the lock, or two
    launches of one name could both see it free and both win.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._groups: dict = {}
        self._reserved: set = set()
        self._resources: dict[str, Any] = {}  # name -> (actor handles, placement group)
        self._cluster: Optional[dict] = None  # the driver's choice of nodes and config

    def reserve(self, name: str) -> bool:
        with self._lock:
            if name in self._groups or name in self._reserved:
                return False
            self._reserved.add(name)
            return True

    def register(self, record, resources: Any = None) -> None:
        with self._lock:
            self._reserved.discard(record.name)
            self._groups[record.name] = record
            if resources is not None:
                self._resources[record.name] = resources

    def release(self, name: str) -> Any:
        """Forget the group; return its Ray objects (or None) so the caller can free them."""
        with self._lock:
            self._reserved.discard(name)
            self._groups.pop(name, None)
            return self._resources.pop(name, None)

    def lookup(self, name: str) -> Optional[object]:
        with self._lock:
            return self._groups.get(name)

    def resources(self, name: str) -> Any:
        with self._lock:
            return self._resources.get(name)

    def set_cluster(self, info: dict) -> dict:
        """Record the driver's cluster choice (the first one wins); return the one recorded."""
        with self._lock:
            if self._cluster is None:
                self._cluster = info
            return self._cluster

    def cluster(self) -> Optional[dict]:
        with self._lock:
            return self._cluster

    def names(self) -> list:
        with self._lock:
            return sorted(self._groups)


GroupRegistry = ray.remote(num_cpus=0, max_concurrency=64)(Registry)


def get_or_create_registry():
    """The registry, made on this (the driver's) node if it does not exist yet.

    Pinned there because it lives exactly as long as the driver: left to Ray,
    it could land on a worker node, and that node going away would take every
    group's record with it.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return GroupRegistry.options(
        name=REGISTRY_ACTOR_NAME, get_if_exists=True, lifetime=None, scheduling_strategy=here
    ).remote()


def get_registry():
    return ray.get_actor(REGISTRY_ACTOR_NAME)
