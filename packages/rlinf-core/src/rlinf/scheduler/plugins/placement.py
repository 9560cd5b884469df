"""Placement strategies: which node and which accelerators each worker gets.

A strategy turns the cluster's list of nodes into one ``WorkerPlacement`` per
worker, in rank order.  Accelerators are numbered globally across nodes, node
0's first, so ``PackedPlacementStrategy(0, 7)`` on two 4-GPU nodes spans both.
Every strategy validates against the real cluster before anything starts.

With a node group label (RLinf's ``node_group_label=`` / ``node_group=``)
ranks are local to the selected node groups instead, counted over each
group's hardware in the groups' order: its configured hardware kind (robots),
else its accelerators, else its nodes themselves (``node_groups`` in
``Cluster(cluster_cfg=...)``, see ``cluster_config``).

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

from ..base.errors import MORE_NODES_HINT, PlacementArgumentError, PlacementError


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
    #: ``(label, hardware type)`` of each node group the node is in whose config names ``hardware``
    #: (a robot kind); placing by node group counts that kind's devices in that group
    node_group_hardware: tuple = field(default=(), compare=False)

    def hardware_infos(self, hw_type: str) -> list:
        """The node's ``HardwareInfo`` records of one hardware type, in device order (``[]`` when unknown)."""
        return [info for r in self.hardware_resources if r.type == hw_type for info in r.infos]


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
    #: the node group the worker was placed through (RLinf's ``node_group_label``; "" without one)
    node_group_label: str = ""
    #: the kind of hardware the worker was given: ``"Accelerator"``, a robot kind, or "" (a node)
    hardware_type: str = ""
    #: the worker's devices of that kind, as indices among the node's devices of that kind
    #: (RLinf's ``local_hardware_ranks``)
    local_hardware_ranks: tuple[int, ...] = ()
    #: the ``HardwareInfo`` records of those devices, from the node's ``hardware_resources`` (RLinf's
    #: ``Worker.hardware_infos``; empty when the node records do not list them)
    hardware_infos: tuple = field(default=(), compare=False)

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


def _finish(per_process: list[tuple]) -> list[WorkerPlacement]:
    """Placements from ``(node rank, global gpu ranks, local gpu ids[, extra fields])`` per process, in rank order."""
    counts: dict[int, int] = {}
    for node_rank, *_ in per_process:
        counts[node_rank] = counts.get(node_rank, 0) + 1
    firsts: dict[int, list[int]] = {}
    for node_rank, _, local, *_ in per_process:
        if local:
            firsts.setdefault(node_rank, []).append(local[0])
    seen: dict[int, int] = {}
    out = []
    for rank, (node_rank, gpus, local, *extra) in enumerate(per_process):
        local_rank = seen.get(node_rank, 0)
        seen[node_rank] = local_rank + 1
        visible = tuple(firsts[node_rank]) + tuple(local[1:]) if local else ()
        fields_ = extra[0] if extra else {}
        out.append(WorkerPlacement(rank, node_rank, local_rank, counts[node_rank], gpus, local, visible, **fields_))
    return out


#: RLinf's hardware type of accelerators
ACCELERATOR = "Accelerator"
#: labels every node answers to: all nodes ("cluster"), all nodes as plain CPU hosts ("node")
ALL_NODES_LABELS = ("cluster", "node")


def _labels(value, what: str) -> Optional[list[str]]:
    """A node group label argument (a label or a sequence of labels) as a list; None stays None."""
    if value is None:
        return None
    if isinstance(value, str):
        labels = [value]
    elif isinstance(value, Sequence):
        labels = [str(label) for label in value]
    else:
        labels = [str(value)]
    if not labels or not all(labels):
        raise PlacementArgumentError(f"{what} must name node groups, got {value!r}")
    return labels


def _group_members(who, nodes: Sequence[NodeInfo], label: str) -> list[NodeInfo]:
    members = list(nodes) if label in ALL_NODES_LABELS else [n for n in nodes if label in n.node_labels]
    if not members:
        known = sorted({lab for n in nodes for lab in n.node_labels} | set(ALL_NODES_LABELS))
        raise PlacementError(
            f"{who!r}: node group {label!r} not found in the cluster (its node groups: {known}; they come "
            f"from Cluster(cluster_cfg=...) node_groups)"
        )
    return members


def group_hardware_type(label: str, members: Sequence[NodeInfo]) -> Optional[str]:
    """The hardware a node group's ranks count, as in RLinf: its configured kind, else ``"Accelerator"``
    when its nodes have accelerators, else None (the nodes themselves); ``"node"`` always counts nodes."""
    if label == "node":
        return None
    declared = {t for n in members for lab, t in n.node_group_hardware if lab == label and t}
    if declared:
        return sorted(declared)[0]
    return ACCELERATOR if any(n.num_gpus for n in members) else None


def _hardware_count(node: NodeInfo, hw_type: Optional[str]) -> int:
    if hw_type is None:
        return 1
    if hw_type == ACCELERATOR:
        return node.num_gpus
    return len(node.hardware_infos(hw_type))


def _group_resources(who, nodes: Sequence[NodeInfo], labels: Sequence[str]) -> list[tuple]:
    """``(node, label, hardware type, index on the node)`` of every resource of the groups, in rank order.

    Raises:
        PlacementError: an unknown label, or two groups that share resources (the same nodes, or the same
            hardware of a node).
    """
    table: list[tuple] = []
    claimed: dict[tuple[int, Optional[str]], str] = {}
    for label in labels:
        members = _group_members(who, nodes, label)
        hw_type = group_hardware_type(label, members)
        shared = sorted(n.node_rank for n in members if (n.node_rank, hw_type) in claimed)
        if shared:
            what = "nodes" if hw_type is None else f"the {hw_type} hardware of nodes"
            raise PlacementError(
                f"{who!r}: node groups {list(labels)} share {what} {shared}; placing across several groups "
                f"needs disjoint groups"
            )
        for node in members:
            claimed[(node.node_rank, hw_type)] = label
            table.extend((node, label, hw_type, i) for i in range(_hardware_count(node, hw_type)))
    return table


class PlacementStrategy(ABC):
    """Maps a cluster's nodes to the workers of one group.

    ``WorkerGroup.launch(cluster, placement_strategy=...)`` calls
    ``get_placement`` with the cluster's nodes and starts one worker per
    placement it returns.  Subclass it for a placement of your own.
    """

    @abstractmethod
    def get_placement(self, nodes: Sequence[NodeInfo]) -> list[WorkerPlacement]:
        """Where each worker of the group goes: one ``WorkerPlacement`` per worker, in rank order.

        Args:
            nodes: the cluster's nodes, in node-rank order (``Cluster.nodes``).

        Returns:
            The placements; entry ``i`` is rank ``i``'s node, local rank and devices.

        Raises:
            PlacementError: the cluster cannot host the placement (too few devices or nodes, an unknown
                node group, a process spanning nodes).
        """

    def _gpus_to_process(self, nodes, gpu_lists) -> list[WorkerPlacement]:
        table = _gpu_table(nodes)
        by_rank = {n.node_rank: n for n in nodes}
        total = len(table)
        used: set[int] = set()
        per_process = []
        for gpus in gpu_lists:
            for g in gpus:
                if g >= total:
                    raise PlacementError(
                        f"{self!r} asks for accelerator {g}, but the cluster has {total} "
                        f"accelerator(s) over {len(nodes)} node(s); {MORE_NODES_HINT}"
                    )
                if g in used:
                    raise PlacementError(f"{self!r} gives accelerator {g} to more than one process")
                used.add(g)
            node_ranks = {table[g][0] for g in gpus}
            if len(node_ranks) != 1:
                raise PlacementError(f"{self!r}: accelerators {list(gpus)} of one process span nodes {sorted(node_ranks)}")
            node_rank = node_ranks.pop()
            local = tuple(table[g][1] for g in gpus)
            per_process.append((node_rank, tuple(gpus), local, _hardware_fields(by_rank[node_rank], "", ACCELERATOR, local)))
        return _finish(per_process)

    def _group_ranks_to_process(self, nodes, rank_lists, labels: list[str]) -> list[WorkerPlacement]:
        """Placements for processes given hardware ranks local to the node groups ``labels`` (RLinf's meaning)."""
        table = _group_resources(self, nodes, labels)
        global_gpu = {key: g for g, key in enumerate(_gpu_table(nodes))}
        used: set[int] = set()
        per_process = []
        for ranks in rank_lists:
            for r in ranks:
                if r >= len(table):
                    raise PlacementError(
                        f"{self!r} asks for hardware rank {r}, but node group(s) {labels} have {len(table)} "
                        f"hardware resource(s) ({_describe(table)})"
                    )
                if r in used:
                    raise PlacementError(f"{self!r} gives hardware rank {r} of node group(s) {labels} to more than one process")
                used.add(r)
            entries = [table[r] for r in ranks]
            node_ranks = sorted({node.node_rank for node, *_ in entries})
            if len(node_ranks) != 1:
                raise PlacementError(f"{self!r}: hardware ranks {list(ranks)} of one process span nodes {node_ranks}")
            kinds = {(label, hw_type) for _, label, hw_type, _ in entries}
            if len(kinds) != 1:
                raise PlacementError(f"{self!r}: hardware ranks {list(ranks)} of one process are of different "
                                     f"node groups or kinds {sorted(kinds, key=str)}")
            node, label, hw_type, _ = entries[0]
            local = tuple(i for *_, i in entries)
            if hw_type == ACCELERATOR:
                gpus = tuple(global_gpu[(node.node_rank, i)] for i in local)
                per_process.append((node.node_rank, gpus, local, _hardware_fields(node, label, hw_type, local)))
            else:  # robots or a node: the worker gets no accelerator of its own
                per_process.append((node.node_rank, (), (), _hardware_fields(node, label, hw_type, local)))
        return _finish(per_process)


def _hardware_fields(node: NodeInfo, label: str, hw_type: Optional[str], local: tuple) -> dict:
    """The ``WorkerPlacement`` fields naming the hardware a process got on ``node``."""
    if hw_type is None:
        return {"node_group_label": label}
    infos = node.hardware_infos(hw_type)
    return {
        "node_group_label": label,
        "hardware_type": hw_type,
        "local_hardware_ranks": tuple(local),
        "hardware_infos": tuple(infos[i] for i in local) if all(i < len(infos) for i in local) else (),
    }


def _describe(table: list[tuple]) -> str:
    kinds: dict[str, int] = {}
    for _, label, hw_type, _ in table:
        key = f"{label}: {'node' if hw_type is None else hw_type}"
        kinds[key] = kinds.get(key, 0) + 1
    return ", ".join(f"{k} x{v}" for k, v in kinds.items()) or "none"


class PackedPlacementStrategy(PlacementStrategy):
    """Processes packed over consecutive hardware ranks ``start..end`` (inclusive).

    Each process takes ``num_hardware_per_process`` devices; with ``stride``
    greater than one a process's devices are spread: stride 2 over 0-3 with
    two per process gives ``{0, 2}`` and ``{1, 3}``.

    Without ``node_group`` the ranks are global accelerator ranks.  With it (a
    label or a list of labels of the cluster config's ``node_groups``; RLinf's
    meaning) they count the hardware of those groups, in the groups' order:
    ``PackedPlacementStrategy(0, 1, node_group="arms")`` puts one worker next
    to each of the first two robots of group ``arms`` (or on its first two
    accelerators when the group has no robots).

    Args:
        start_hardware_rank: the first hardware rank to use.
        end_hardware_rank: the last hardware rank to use (inclusive).
        num_hardware_per_process: how many devices each process gets.
        stride: the distance between the ranks of one process's devices.
        node_group: a node group label, or a list of them, to count ranks within (None: the whole cluster).

    Raises:
        PlacementArgumentError: a negative rank, ``end < start``, a count of devices that does not split into
            processes, or an empty label.
        TypeError: a rank or count is not an int.
        PlacementError (at placement): ranks beyond the hardware, a process spanning nodes, an unknown label,
            or groups whose ranks count nodes (packing needs hardware, as in RLinf).

    Example:
        ```python
        cluster = Cluster(num_nodes=1)
        # four processes on accelerators 0, 1, 2, 3, one each
        group = MyWorker.create_group().launch(cluster, PackedPlacementStrategy(0, 3), name="actor")
        # two processes holding accelerators {0, 1} and {2, 3}
        PackedPlacementStrategy(0, 3, num_hardware_per_process=2)
        # two processes holding accelerators {0, 2} and {1, 3}
        PackedPlacementStrategy(0, 3, num_hardware_per_process=2, stride=2)
        ```
    """

    def __init__(self, start_hardware_rank: int, end_hardware_rank: int, num_hardware_per_process: int = 1,
                 stride: int = 1, node_group: Optional[str | Sequence[str]] = None):
        self.start = _check_int(start_hardware_rank, "start_hardware_rank")
        self.end = _check_int(end_hardware_rank, "end_hardware_rank")
        self.per_process = _check_int(num_hardware_per_process, "num_hardware_per_process", 1)
        self.stride = _check_int(stride, "stride", 1)
        self.node_group_labels = _labels(node_group, "node_group")
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
        """The hardware ranks of each process, in rank order."""
        ranks = list(range(self.start, self.end + 1))
        block = self.per_process * self.stride
        out = []
        for b in range(0, len(ranks), block):
            chunk = ranks[b : b + block]
            out.extend(tuple(chunk[s :: self.stride]) for s in range(self.stride))
        return out

    def get_placement(self, nodes):
        """The ``WorkerPlacement`` of each process, in rank order: one per block of ``process_gpu_lists``.

        Args:
            nodes (Sequence[NodeInfo]): the cluster's nodes, in node-rank order.

        Raises:
            PlacementError: ranks beyond the cluster's (or the node groups') hardware, a process whose devices
                span nodes, an unknown label, or a node group without hardware.
        """
        if self.node_group_labels is None:
            return self._gpus_to_process(nodes, self.process_gpu_lists())
        for label in self.node_group_labels:
            if group_hardware_type(label, _group_members(self, nodes, label)) is None:
                raise PlacementError(
                    f"{self!r}: node group {label!r} has no hardware (no accelerators, no configured hardware); "
                    f"packed placement needs hardware, as in RLinf: use NodePlacementStrategy(..., "
                    f"node_group_label={label!r}) to place on its nodes"
                )
        return self._group_ranks_to_process(nodes, self.process_gpu_lists(), self.node_group_labels)

    def __repr__(self):
        group = "" if self.node_group_labels is None else f", node_group={_label_repr(self.node_group_labels)}"
        return (
            f"PackedPlacementStrategy({self.start}, {self.end}, "
            f"num_hardware_per_process={self.per_process}, stride={self.stride}{group})"
        )


class FlexiblePlacementStrategy(PlacementStrategy):
    """One process per inner list of hardware ranks (one node each).

    Without ``node_group_label`` the ranks are global accelerator ranks.  With
    it (a label or a list of labels of the cluster config's ``node_groups``)
    they count the hardware of those groups in the groups' order, as in RLinf:
    the group's robots, else its accelerators, else its nodes (one rank per
    node, the worker then gets no accelerator).  Processes keep the order given
    (RLinf sorts them by first rank).

    Args:
        hardware_ranks_list: one list of hardware ranks per process, all on one node.
        node_group_label: a node group label, or a list of them, to count ranks within (None: the whole
            cluster).

    Raises:
        PlacementArgumentError: an empty list or inner list, a negative rank, an empty label.
        TypeError: a rank is not an int.
        PlacementError (at placement): ranks beyond the hardware, a rank given twice, a process spanning
            nodes or kinds of hardware, an unknown label.

    Example:
        ```python
        # three processes: accelerators {0, 1}, {2} and {3}
        placement = FlexiblePlacementStrategy([[0, 1], [2], [3]])
        group = MyWorker.create_group().launch(cluster, placement_strategy=placement, name="rollout")
        # one env worker next to each of the first two robots of node group "franka"
        FlexiblePlacementStrategy([[0], [1]], node_group_label="franka")
        ```
    """

    def __init__(self, hardware_ranks_list: Sequence[Sequence[int]],
                 node_group_label: Optional[str | Sequence[str]] = None):
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
        self.node_group_labels = _labels(node_group_label, "node_group_label")

    def get_placement(self, nodes):
        """The ``WorkerPlacement`` of each process: one per inner list of ranks, in the order given.

        Args:
            nodes (Sequence[NodeInfo]): the cluster's nodes, in node-rank order.

        Raises:
            PlacementError: a rank beyond the hardware, a rank given to two processes, one process's ranks
                on several nodes or of several kinds, an unknown label.
        """
        if self.node_group_labels is None:
            return self._gpus_to_process(nodes, self.lists)
        return self._group_ranks_to_process(nodes, self.lists, self.node_group_labels)

    def __repr__(self):
        group = "" if self.node_group_labels is None else f", node_group_label={_label_repr(self.node_group_labels)}"
        return f"FlexiblePlacementStrategy({[list(x) for x in self.lists]}{group})"


def _label_repr(labels: list[str]) -> str:
    return repr(labels[0] if len(labels) == 1 else labels)


class NodePlacementStrategy(PlacementStrategy):
    """One CPU process per entry of ``node_ranks``, on the node that entry names.

    Without ``node_group_label`` the entries are global node ranks.  With it
    (a label or a list of labels of the cluster config's ``node_groups``) they
    index the nodes of those groups, in the groups' order and each group's
    node order, as in RLinf: ``NodePlacementStrategy([0, 1], node_group_label="arms")``
    puts one worker on each of the first two nodes of group ``arms``.  The
    labels ``cluster`` and ``node`` name every node.

    Args:
        node_ranks: the node of each process, by rank (repeat a node for several processes on it).
        node_group_label: a node group label, or a list of them, whose nodes ``node_ranks`` index (None: the
            whole cluster).

    Raises:
        PlacementArgumentError: ``node_ranks`` is empty or not a list, a rank is negative, a label is empty.
        TypeError: a rank is not an int.
        PlacementError (at placement): an unknown label, groups that share nodes, or a rank beyond the nodes.

    Example:
        ```python
        # four CPU processes on node 0
        group = MyWorker.create_group().launch(cluster, NodePlacementStrategy([0] * 4), name="agent")
        # one process on each of the first two nodes of node group "arms"
        NodePlacementStrategy([0, 1], node_group_label="arms")
        ```
    """

    def __init__(self, node_ranks: Sequence[int], node_group_label: Optional[str | Sequence[str]] = None):
        if isinstance(node_ranks, (str, bytes, int)) or not node_ranks:
            raise PlacementArgumentError("node_ranks must be a non-empty list of node ranks")
        self.node_ranks = [_check_int(n, "node rank") for n in node_ranks]
        self.node_group_labels = _labels(node_group_label, "node_group_label")

    def _selected_nodes(self, nodes: Sequence[NodeInfo]) -> list[tuple[NodeInfo, str]]:
        if self.node_group_labels is None:
            return [(n, "") for n in nodes]
        selected: list[tuple[NodeInfo, str]] = []
        seen: set[int] = set()
        for label in self.node_group_labels:
            members = _group_members(self, nodes, label)
            overlap = seen.intersection(n.node_rank for n in members)
            if overlap:
                raise PlacementError(
                    f"{self!r}: node groups {self.node_group_labels} share nodes {sorted(overlap)}; placing across "
                    f"several groups needs disjoint groups"
                )
            seen.update(n.node_rank for n in members)
            selected.extend((n, label) for n in members)
        return selected

    def get_placement(self, nodes):
        """The ``WorkerPlacement`` of each process: one per entry of ``node_ranks``, without accelerators.

        Args:
            nodes (Sequence[NodeInfo]): the cluster's nodes, in node-rank order.

        Raises:
            PlacementError: a node rank beyond the cluster's (or the node groups') nodes, an unknown label,
                or node groups that share nodes.
        """
        selected = self._selected_nodes(nodes)
        for n in self.node_ranks:
            if n >= len(selected):
                where = f"the cluster has {len(nodes)} node(s); {MORE_NODES_HINT}" if self.node_group_labels is None \
                    else f"node group(s) {self.node_group_labels} have {len(selected)} node(s)"
                raise PlacementError(f"{self!r} asks for node {n}, but {where}")
        return _finish([(selected[n][0].node_rank, (), (), {"node_group_label": selected[n][1]})
                        for n in self.node_ranks])

    def __repr__(self):
        if self.node_group_labels is None:
            return f"NodePlacementStrategy({self.node_ranks})"
        return f"NodePlacementStrategy({self.node_ranks}, node_group_label={_label_repr(self.node_group_labels)})"


def default_placement(nodes: Sequence[NodeInfo]) -> PlacementStrategy:
    """One worker per accelerator when there are any, else one worker on node 0."""
    total = sum(n.num_gpus for n in nodes)
    if total:
        return PackedPlacementStrategy(0, total - 1)
    return NodePlacementStrategy([0])
