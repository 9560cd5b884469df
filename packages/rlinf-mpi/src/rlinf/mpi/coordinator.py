"""The job's bookkeeping, kept by rank 0: which ranks host which group, and the group registry.

Workers reach it through requests to rank 0; the driver calls it directly.
Ranks are handed out per node in rank order and only when every worker of a
group fits, so a launch that asks for more workers than a node has free
ranks fails before any of them starts.
"""

from __future__ import annotations

import threading
from typing import Optional, Sequence

from rlinf.scheduler.base.errors import PlacementError

from . import runtime, status


class Coordinator:
    def __init__(self, world: runtime.World):
        self._world = world
        nodes = world.node_ranks()
        self._slots = {info.rank: nodes[info.hostname] for info in world.ranks if info.rank != 0}
        self._owner: dict[int, str] = {}  # rank -> group hosted there
        self._groups: dict[str, object] = {}
        self._handles: dict[str, list] = {}  # group -> [(mpi rank, rank, generation)], rank order
        self._reserved: set[str] = set()
        self._lock = threading.Lock()

    # -- ranks ---------------------------------------------------------------------
    def allocate(self, group: str, node_ranks: Sequence[int]) -> list[int]:
        """One free rank per worker, on the worker's node; all or nothing."""
        with self._lock:
            free: dict[int, list[int]] = {}
            for rank in sorted(self._slots):
                if rank not in self._owner:
                    free.setdefault(self._slots[rank], []).append(rank)
            wanted: dict[int, int] = {}
            for node in node_ranks:
                wanted[node] = wanted.get(node, 0) + 1
            for node, count in sorted(wanted.items()):
                have = len(free.get(node, []))
                if count > have:
                    total = sum(1 for n in self._slots.values() if n == node)
                    raise PlacementError(self._shortage(group, node, count, have, total))
            picked = []
            for node in node_ranks:
                rank = free[node].pop(0)
                self._owner[rank] = group
                picked.append(rank)
            return picked

    def _shortage(self, group: str, node: int, count: int, have: int, total: int) -> str:
        busy = sorted({g for r, g in self._owner.items() if self._slots[r] == node})
        how = (
            f"run with more ranks (mpiexec -n {self._world.size + count - have} ...)"
            if self._world.mode == "mpiexec"
            else f"set {runtime.SLOTS_ENV} to at least {len(self._slots) + count - have}"
        )
        return (
            f"group {group!r} needs {count} worker rank(s) on node {node} but only {have} of the job's {total} "
            f"worker rank(s) there are free (groups holding ranks: {busy or 'none'}); each rank hosts one worker "
            f"at a time and rank 0 runs the program: {how}, or stop groups that are done"
        )

    def release_ranks(self, ranks: Sequence[int]) -> None:
        with self._lock:
            for rank in ranks:
                self._owner.pop(rank, None)

    # -- registry ---------------------------------------------------------------------
    def reserve(self, name: str) -> bool:
        with self._lock:
            if name in self._groups or name in self._reserved:
                return False
            self._reserved.add(name)
            return True

    def register(self, body) -> None:
        """``(record, handles)``: the group's record and where its workers run, for ``attach``."""
        record, handles = body
        with self._lock:
            self._reserved.discard(record.name)
            self._groups[record.name] = record
            self._handles[record.name] = list(handles)
            status.publish(self._groups.values())  # for python -m rlinf.scheduler status

    def release(self, name: str) -> None:
        with self._lock:
            self._reserved.discard(name)
            self._handles.pop(name, None)
            if self._groups.pop(name, None) is not None:
                status.publish(self._groups.values())

    def attach(self, name: str) -> Optional[list]:
        """``[(mpi rank, rank, generation)]`` of the running group ``name``, rank order; None if not running."""
        with self._lock:
            handles = self._handles.get(name)
            return None if handles is None else list(handles)

    def lookup(self, name: str) -> Optional[object]:
        with self._lock:
            return self._groups.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._groups)

    # -- serving other ranks ------------------------------------------------------------
    #: what other ranks may ask: each takes the request's body as its one argument
    OPS = ("allocate", "release_ranks", "reserve", "register", "release", "lookup", "names", "attach")

    def handle(self, op: str, body):
        """One request, as any rank sends it: ``op`` names the method, ``body`` its argument."""
        if op not in self.OPS:
            raise ValueError(f"rank 0 does not serve {op!r}")
        if op == "allocate":
            return self.allocate(*body)
        if op == "names":
            return self.names()
        return getattr(self, op)(body)

    def serve(self, service) -> None:
        for op in self.OPS:
            service.handle(op, lambda source, body, reply, op=op: reply(True, self.handle(op, body)))
