"""Placement strategies: which node and which accelerators each worker gets.

A strategy turns the cluster's list of nodes into one ``WorkerPlacement`` per
worker, in rank order.  Accelerators are numbered globally across nodes, node
0's first, so ``PackedPlacementStrategy(0, 7)`` on two 4-GPU nodes spans both.
Every strategy validates against the real cluster before anything starts.

Device visibility (see ``accelerator``): every worker of a group on a node
sees the group's devices on that node, each worker's first device at the
index of its ``LOCAL_RANK``, its further devices appended after them;
``WorkerPlacement.visible_gpu_ids`` is that list and ``device_indices`` the
positions of the worker's own devices in it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

from ..base.errors import PlacementError


@dataclass(frozen=True)
class NodeInfo:
    """One node of a cluster as a launcher reports it."""

    node_rank: int
    ip: str
    num_gpus: int
    node_id: str = ""  # the launcher's own identifier for the node
    hostname: str = ""
    accelerator: str = ""  # the accelerator kind's name ("" when unknown or none)


@dataclass(frozen=True)
class WorkerPlacement:
    rank: int
    node_rank: int
    local_rank: int
    local_world_size: int
    gpu_ids: tuple[int, ...]  # global accelerator ranks
    local_gpu_ids: tuple[int, ...]  # device indices on the node (this worker's own)
    #: node-local devices the worker sees, in order: the group's workers' first devices on this
    #: node by local rank, then this worker's further devices
    visible_gpu_ids: tuple[int, ...] = ()

    @property
    def gpu_id(self):
        return self.gpu_ids[0] if self.gpu_ids else None

    @property
    def device_indices(self) -> list[int]:
        """Positions of this worker's own devices in ``visible_gpu_ids`` (``[LOCAL_RANK, ...]``)."""
        return [self.visible_gpu_ids.index(d) for d in self.local_gpu_ids]


def _check_int(value, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def _gpu_table(nodes: Sequence[NodeInfo]) -> list[tuple[int, int]]:
    """Global accelerator rank -> (node rank, local device index)."""
    table = []
    for node in nodes:
        table.extend((node.node_rank, i) for i in range(node.num_gpus))
    return table


def _finish(per_process: list[tuple[int, tuple[int, ...], tuple[int, ...]]]) -> list[WorkerPlacement]:
    counts: dict[int, int] = {}
    for node_rank, _, _ in per_process:
        counts[node_rank] = counts.get(node_rank, 0) + 1
    firsts: dict[int, list[int]] = {}
    for node_rank, _, local in per_process:
        if local:
            firsts.setdefault(node_rank, []).append(local[0])
    seen: dict[int, int] = {}
    out = []
    for rank, (node_rank, gpus, local) in enumerate(per_process):
        local_rank = seen.get(node_rank, 0)
        seen[node_rank] = local_rank + 1
        visible = tuple(firsts[node_rank]) + tuple(local[1:]) if local else ()
        out.append(WorkerPlacement(rank, node_rank, local_rank, counts[node_rank], gpus, local, visible))
    return out


class PlacementStrategy(ABC):
    """Maps a cluster's nodes to the workers of one group."""

    @abstractmethod
    def get_placement(self, nodes: Sequence[NodeInfo]) -> list[WorkerPlacement]:
        """Placements in rank order; raises PlacementError if the cluster cannot host them."""

    def _gpus_to_process(self, nodes, gpu_lists) -> list[WorkerPlacement]:
        table = _gpu_table(nodes)
        total = len(table)
        used: set[int] = set()
        per_process = []
        for gpus in gpu_lists:
            for g in gpus:
                if g >= total:
                    raise PlacementError(
                        f"{self!r} asks for accelerator {g}, but the cluster has {total} "
                        f"accelerator(s) over {len(nodes)} node(s)"
                    )
                if g in used:
                    raise PlacementError(f"{self!r} gives accelerator {g} to more than one process")
                used.add(g)
            node_ranks = {table[g][0] for g in gpus}
            if len(node_ranks) != 1:
                raise PlacementError(f"{self!r}: accelerators {list(gpus)} of one process span nodes {sorted(node_ranks)}")
            per_process.append((node_ranks.pop(), tuple(gpus), tuple(table[g][1] for g in gpus)))
        return _finish(per_process)


class PackedPlacementStrategy(PlacementStrategy):
    """Processes packed over consecutive accelerators ``start..end`` (inclusive).

    Each process takes ``num_hardware_per_process`` accelerators; with ``stride``
    greater than one a process's accelerators are spread: stride 2 over 0-3 with
    two per process gives ``{0, 2}`` and ``{1, 3}``.
    """

    def __init__(self, start_hardware_rank: int, end_hardware_rank: int, num_hardware_per_process: int = 1, stride: int = 1):
        self.start = _check_int(start_hardware_rank, "start_hardware_rank")
        self.end = _check_int(end_hardware_rank, "end_hardware_rank")
        self.per_process = _check_int(num_hardware_per_process, "num_hardware_per_process", 1)
        self.stride = _check_int(stride, "stride", 1)
        if self.end < self.start:
            raise ValueError(f"end_hardware_rank ({self.end}) must be >= start_hardware_rank ({self.start})")
        count = self.end - self.start + 1
        block = self.per_process * self.stride
        if count % block:
            raise ValueError(
                f"{count} accelerators ({self.start}..{self.end}) do not split into processes of "
                f"{self.per_process} with stride {self.stride}"
            )

    def process_gpu_lists(self) -> list[tuple[int, ...]]:
        ranks = list(range(self.start, self.end + 1))
        block = self.per_process * self.stride
        out = []
        for b in range(0, len(ranks), block):
            chunk = ranks[b : b + block]
            out.extend(tuple(chunk[s :: self.stride]) for s in range(self.stride))
        return out

    def get_placement(self, nodes):
        return self._gpus_to_process(nodes, self.process_gpu_lists())

    def __repr__(self):
        return (
            f"PackedPlacementStrategy({self.start}, {self.end}, "
            f"num_hardware_per_process={self.per_process}, stride={self.stride})"
        )


class FlexiblePlacementStrategy(PlacementStrategy):
    """One process per inner list of global accelerator ranks (one node each)."""

    def __init__(self, hardware_ranks_list: Sequence[Sequence[int]]):
        if isinstance(hardware_ranks_list, (str, bytes)) or not hardware_ranks_list:
            raise ValueError("hardware_ranks_list must be a non-empty list of lists of accelerator ranks")
        lists = []
        for inner in hardware_ranks_list:
            if isinstance(inner, (int, str, bytes)) or not inner:
                raise ValueError(f"each entry of hardware_ranks_list must be a non-empty list, got {inner!r}")
            lists.append(tuple(_check_int(g, "accelerator rank") for g in inner))
        self.lists = lists

    def get_placement(self, nodes):
        return self._gpus_to_process(nodes, self.lists)

    def __repr__(self):
        return f"FlexiblePlacementStrategy({[list(x) for x in self.lists]})"


class NodePlacementStrategy(PlacementStrategy):
    """One CPU process per entry, on the node that entry names."""

    def __init__(self, node_ranks: Sequence[int]):
        if isinstance(node_ranks, (str, bytes, int)) or not node_ranks:
            raise ValueError("node_ranks must be a non-empty list of node ranks")
        self.node_ranks = [_check_int(n, "node rank") for n in node_ranks]

    def get_placement(self, nodes):
        for n in self.node_ranks:
            if n >= len(nodes):
                raise PlacementError(f"{self!r} asks for node {n}, but the cluster has {len(nodes)} node(s)")
        return _finish([(n, (), ()) for n in self.node_ranks])

    def __repr__(self):
        return f"NodePlacementStrategy({self.node_ranks})"


def default_placement(nodes: Sequence[NodeInfo]) -> PlacementStrategy:
    """One worker per accelerator when there are any, else one worker on node 0."""
    total = sum(n.num_gpus for n in nodes)
    if total:
        return PackedPlacementStrategy(0, total - 1)
    return NodePlacementStrategy([0])
