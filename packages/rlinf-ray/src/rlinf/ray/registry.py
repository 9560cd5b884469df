"""The cluster-wide group registry, a named Ray actor owned by the driver.

Any worker or the driver finds a group's workers (their info and transport
endpoints) here by group name.  Names are reserved before workers start, so
two launches can never take the same name.
"""

from __future__ import annotations

from typing import Optional

import ray

REGISTRY_ACTOR_NAME = "rlinf_registry"


@ray.remote(num_cpus=0, max_concurrency=64)
class GroupRegistry:
    def __init__(self):
        self._groups: dict = {}
        self._reserved: set = set()

    def reserve(self, name: str) -> bool:
        if name in self._groups or name in self._reserved:
            return False
        self._reserved.add(name)
        return True

    def register(self, record) -> None:
        self._reserved.discard(record.name)
        self._groups[record.name] = record

    def release(self, name: str) -> None:
        self._reserved.discard(name)
        self._groups.pop(name, None)

    def lookup(self, name: str) -> Optional[object]:
        return self._groups.get(name)

    def names(self) -> list:
        return sorted(self._groups)


def get_or_create_registry():
    return GroupRegistry.options(name=REGISTRY_ACTOR_NAME, get_if_exists=True, lifetime=None).remote()


def get_registry():
    return ray.get_actor(REGISTRY_ACTOR_NAME)
