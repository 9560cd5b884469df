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
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..base.errors import PlacementArgumentError, PlacementError


@dataclass(frozen=True)
class NodeInfo:
    """One node of a cluster as a launcher reports it."""

    node_rank: int
    ip: str
    num_gpus: int
    node_id: str = ""  # the launcher's own identifier for the node
    hostname: str = ""
    accelerator: str = ""  # the accelerator kind's name ("" when unknown or none)
    #: labels of the cluster config's node groups this node belongs to (RLinf's ``node_labels``)
    node_labels: tuple[str, ...] = field(default=(), compare=False)
    #: the node's ``HardwareResource`` list (accelerators and configured hardware such as robots)
    hardware_resources: tuple = field(default=(), compare=False)


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
        raise PlacementArgumentError(f"{what} must be >= {minimum}, got {value}")
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
            raise PlacementArgumentError(
                f"end_hardware_rank ({self.end}) must be >= start_hardware_rank ({self.start})"
            )
        count = self.end - self.start + 1
        block = self.per_process * self.stride
        if count % block:
            raise PlacementArgumentError(
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
            raise PlacementArgumentError("hardware_ranks_list must be a non-empty list of lists of accelerator ranks")
        lists = []
        for inner in hardware_ranks_list:
            if isinstance(inner, (int, str, bytes)) or not inner:
                raise PlacementArgumentError(
                    f"each entry of hardware_ranks_list must be a non-empty list, got {inner!r}"
                )
            lists.append(tuple(_check_int(g, "accelerator rank") for g in inner))
        self.lists = lists

    def get_placement(self, nodes):
        return self._gpus_to_process(nodes, self.lists)

    def __repr__(self):
        return f"FlexiblePlacementStrategy({[list(x) for x in self.lists]})"


#: labels every node answers to: all nodes ("cluster"), all nodes as plain CPU hosts ("node")
ALL_NODES_LABELS = ("cluster", "node")


class NodePlacementStrategy(PlacementStrategy):
    """One CPU process per entry of ``node_ranks``, on the node that entry names.

    Without ``node_group_label`` the entries are global node ranks.  With it
    (a label or a list of labels of the cluster config's ``node_groups``) they
    index the nodes of those groups, in the groups' order and each group's
    node order, as in RLinf: ``NodePlacementStrategy([0, 1], node_group_label="arms")``
    puts one worker on each of the first two nodes of group ``arms``.  The
    labels ``cluster`` and ``node`` name every node.

    Raises:
        PlacementArgumentError: ``node_ranks`` is empty or not a list, a rank is negative, a label is empty.
        TypeError: a rank is not an int.
        PlacementError (at placement): an unknown label, groups that share nodes, or a rank beyond the nodes.
    """

    def __init__(self, node_ranks: Sequence[int], node_group_label: Optional[str | Sequence[str]] = None):
        if isinstance(node_ranks, (str, bytes, int)) or not node_ranks:
            raise PlacementArgumentError("node_ranks must be a non-empty list of node ranks")
        self.node_ranks = [_check_int(n, "node rank") for n in node_ranks]
        if node_group_label is None:
            labels = None
        elif isinstance(node_group_label, str):
            labels = [node_group_label]
        elif isinstance(node_group_label, Sequence):
            labels = [str(label) for label in node_group_label]
        else:
            labels = [str(node_group_label)]
        if labels is not None and (not labels or not all(labels)):
            raise PlacementArgumentError(f"node_group_label must name node groups, got {node_group_label!r}")
        self.node_group_labels = labels

    def _selected_nodes(self, nodes: Sequence[NodeInfo]) -> list[NodeInfo]:
        if self.node_group_labels is None:
            return list(nodes)
        selected: list[NodeInfo] = []
        seen: set[int] = set()
        for label in self.node_group_labels:
            members = list(nodes) if label in ALL_NODES_LABELS else [n for n in nodes if label in n.node_labels]
            if not members:
                known = sorted({lab for n in nodes for lab in n.node_labels} | set(ALL_NODES_LABELS))
                raise PlacementError(
                    f"{self!r}: node group {label!r} not found in the cluster (its node groups: {known}; they come "
                    f"from Cluster(cluster_cfg=...) node_groups)"
                )
            overlap = seen.intersection(n.node_rank for n in members)
            if overlap:
                raise PlacementError(
                    f"{self!r}: node groups {self.node_group_labels} share nodes {sorted(overlap)}; placing across "
                    f"several groups needs disjoint groups"
                )
            seen.update(n.node_rank for n in members)
            selected.extend(members)
        return selected

    def get_placement(self, nodes):
        selected = self._selected_nodes(nodes)
        for n in self.node_ranks:
            if n >= len(selected):
                where = f"the cluster has {len(nodes)} node(s)" if self.node_group_labels is None else (
                    f"node group(s) {self.node_group_labels} have {len(selected)} node(s)"
                )
                raise PlacementError(f"{self!r} asks for node {n}, but {where}")
        return _finish([(selected[n].node_rank, (), ()) for n in self.node_ranks])

    def __repr__(self):
        if self.node_group_labels is None:
            return f"NodePlacementStrategy({self.node_ranks})"
        label = self.node_group_labels[0] if len(self.node_group_labels) == 1 else self.node_group_labels
        return f"NodePlacementStrategy({self.node_ranks}, node_group_label={label!r})"


def default_placement(nodes: Sequence[NodeInfo]) -> PlacementStrategy:
    """One worker per accelerator when there are any, else one worker on node 0."""
    total = sum(n.num_gpus for n in nodes)
    if total:
        return PackedPlacementStrategy(0, total - 1)
    return NodePlacementStrategy([0])
