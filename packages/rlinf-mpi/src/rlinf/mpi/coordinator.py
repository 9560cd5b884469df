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


#: the prefix of the worker group that hosts a channel (``Channel.create``)
CHANNEL_PREFIX = "Channel."


def describe(group: str) -> str:
    """How a message names the holder of ranks: ``channel 'q'`` for a channel's host group, else ``group 'g'``."""
    if group.startswith(CHANNEL_PREFIX):
        return f"channel {group[len(CHANNEL_PREFIX):]!r}"
    return f"group {group!r}"


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
        """One free rank per worker of ``group``, on the worker's node; all or nothing.

        ``node_ranks``: the node of each worker, in rank order.  Returns the MPI
        ranks picked, in the same order.  Raises ``PlacementError`` when a node
        has fewer free ranks than the group asks there; nothing is taken then.
        """
        with self._lock:
            free: dict[int, list[int]] = {}
            for rank in sorted(self._slots):
                if rank not in self._owner:
                    free.setdefault(self._slots[rank], []).append(rank)
            wanted: dict[int, int] = {}
            for node in node_ranks:
                wanted[node] = wanted.get(node, 0) + 1
            short = {node: count for node, count in sorted(wanted.items()) if count > len(free.get(node, []))}
            if short:
                raise PlacementError(self._shortage(group, wanted, free, short))
            picked = []
            for node in node_ranks:
                rank = free[node].pop(0)
                self._owner[rank] = group
                picked.append(rank)
            return picked

    def _shortage(self, group: str, wanted: dict, free: dict, short: dict) -> str:
        """One message: what asked, what the job has, what holds the ranks, and the ``-n`` that fits."""
        node = next(iter(short))  # the first node that is short; the fix below covers every short node
        count, have = wanted[node], len(free.get(node, []))
        hosts = sum(1 for n in self._slots.values() if n == node)
        deficit = sum(c - len(free.get(n, [])) for n, c in short.items())
        multinode = len(set(self._slots.values()) | {0}) > 1
        holders: dict[str, int] = {}
        for rank, owner in sorted(self._owner.items()):
            if self._slots[rank] == node:
                holders[owner] = holders.get(owner, 0) + 1
        used = hosts - have
        if not holders:
            in_use = ""
        elif len(holders) == 1:
            in_use = f", of which {used} {'is' if used == 1 else 'are'} in use by {describe(next(iter(holders)))}"
        else:
            parts = ", ".join(f"{n} by {describe(owner)}" for owner, n in holders.items())
            in_use = f", of which {used} are in use ({parts})"
        worker_ranks = f"{hosts} on node {node}" if multinode else f"{hosts}"
        if self._world.mode == "mpiexec":
            job = f"the job has {self._world.size} ranks (-n {self._world.size}): rank 0 runs the program"
            fix = f"run with mpiexec -n {self._world.size + deficit}"
            if multinode:
                more = [f"{c - len(free.get(n, []))} more on node {n}" for n, c in short.items()]
                fix += ", with " + " and ".join(more)
        else:
            job = f"the job has {self._world.size} ranks ({runtime.SLOTS_ENV}={len(self._slots)}): rank 0 runs the program"
            fix = f"set {runtime.SLOTS_ENV}={len(self._slots) + deficit}"
        return (
            f"{describe(group)} needs {count} worker rank{'s' if count != 1 else ''}{f' on node {node}' if multinode else ''} "
            f"but {'none is' if have == 0 else f'only {have} is' if have == 1 else f'only {have} are'} free: {job} and {worker_ranks} host one worker each"
            f"{in_use}; {fix} (or stop groups that are done first)"
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
