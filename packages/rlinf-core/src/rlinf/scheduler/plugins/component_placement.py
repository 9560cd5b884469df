"""RLinf's config-driven placement: ``cluster.component_placement`` to one strategy per component.

A config maps component names to resources, e.g.::

    cluster:
      num_nodes: 1
      component_placement:
        actor,rollout: 0-7        # collocated: both on accelerators 0..7, one process each
        env: 0-3:0-7              # resource ranks 0..3 carry process ranks 0..7
        reward: all               # every resource of the cluster

A key lists components sharing the entry; a value is ``all``, ``N``, ``A-B``
(comma lists of those too), or ``RESOURCES:PROCESSES`` with process ranks
``0..P-1``; a dict value ``{placement: ...}`` is accepted as well.  Resource
ranks are global accelerator ranks on a cluster with accelerators, and node
ranks on a CPU-only cluster (``0:0-3`` is four CPU processes on node 0).  Each
resource carries the same number of processes, or each process the same number
of resources.  Everything is checked against the cluster when the object is
built, before any worker starts, with RLinf's messages.
"""

from __future__ import annotations

import re
from enum import Enum, auto
from typing import Any, Optional

from ..base.errors import PlacementError
from .placement import FlexiblePlacementStrategy, NodePlacementStrategy, PackedPlacementStrategy, PlacementStrategy


class PlacementMode(Enum):
    """How a ``ComponentPlacement``'s components share the cluster's resources (RLinf's modes).

    ``COLLOCATED``: every component uses the same set of resources (RLinf then
    syncs weights inside a device, e.g. by CUDA IPC).  ``DISAGGREGATED``: each
    component has resources of its own, no two overlapping.  ``HYBRID``: any
    other mix, some resources shared and some not (also what
    ``HybridComponentPlacement`` always reports).
    """

    COLLOCATED = auto()
    DISAGGREGATED = auto()
    HYBRID = auto()


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg.key`` for dicts, OmegaConf configs and plain objects alike."""
    if cfg is None:
        return default
    if isinstance(cfg, dict):
        return cfg.get(key, default)
    getter = getattr(cfg, "get", None)
    if callable(getter):  # DictConfig
        return getter(key, default)
    return getattr(cfg, key, default)


def _items(mapping: Any) -> list[tuple[str, Any]]:
    if isinstance(mapping, dict):
        return list(mapping.items())
    keys = getattr(mapping, "keys", None)
    if not callable(keys):
        raise PlacementError(f"component_placement must be a mapping of component names to resources, got {mapping!r}")
    return [(k, mapping[k]) for k in keys()]


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def _parse_ranks(text: str, total: Optional[int], what: str, components: list[str]) -> list[int]:
    """``"all"``, ``"3"``, ``"0-7"`` or a comma list of them, checked against ``total``."""
    text = text.strip()
    if text == "all":
        if total is None:
            raise PlacementError(f"'all' is not valid for the process ranks of components {components}")
        if total == 0:
            raise PlacementError(f"components {components} ask for all {what}s, but the cluster has none")
        return list(range(total))
    ranks: list[int] = []
    for part in text.split(","):
        m = _RANGE.match(part)
        if not m:
            raise PlacementError(
                f"Invalid {what} range for components {components}: {text!r}, expected format: start-end"
            )
        start, end = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if end < start:
            raise PlacementError(f"Start {what} ID {start} must be less than or equal to end {what} ID {end}.")
        if total is not None and start >= total:
            raise PlacementError(f"Start {what} ID {start} must be less than total number of {what}s {total}.")
        if total is not None and end >= total:
            raise PlacementError(f"End {what} ID {end} must be less than total number of {what}s {total}.")
        ranks.extend(range(start, end + 1))
    if len(set(ranks)) != len(ranks):
        raise PlacementError(f"components {components} list {what} ranks more than once: {text!r}")
    return ranks


class ComponentPlacement:
    """Parses ``component_placement`` of a config and gives each component its strategy.

    ``config`` is the whole config (``config.cluster.component_placement``), the
    cluster section itself (``config.component_placement``), or ``None`` to use
    the config the cluster was created with (``Cluster(cluster_cfg=...)``).
    ``cluster`` is the ``Cluster``, or the list of ``NodeInfo`` to plan for
    (planning for a cluster one is not connected to).

    Args:
        config: the config holding ``cluster.component_placement`` (a dict, an OmegaConf ``DictConfig`` or
            an object with attributes), its ``cluster`` section, or None.
        cluster (Cluster | list[NodeInfo]): the ``Cluster``, or a list of ``NodeInfo``.

    Raises:
        PlacementError: no ``component_placement`` in the config, a malformed key or value, a component
            placed twice, node groups in an entry, processes that do not spread evenly over their
            resources, or a strategy the cluster cannot host (the message names the component).

    Example:
        ```python
        cfg = OmegaConf.create({"cluster": {"num_nodes": 1, "component_placement": {"actor,rollout": "0-3"}}})
        cluster = Cluster(cluster_cfg=cfg.cluster)
        placement = ComponentPlacement(cfg, cluster)
        actor = Actor.create_group(cfg).launch(
            cluster, placement_strategy=placement.get_strategy("actor"), name="actor"
        )
        assert placement.get_world_size("rollout") == 4
        ```
    """

    def __init__(self, config: Any, cluster):
        cluster_cfg = _get(config, "cluster") if _get(config, "component_placement") is None else config
        if config is None:
            cluster_cfg = getattr(cluster, "cluster_cfg", None)
        placement_cfg = _get(cluster_cfg, "component_placement")
        if placement_cfg is None:
            raise PlacementError("the config has no cluster.component_placement")
        self._cluster = cluster
        nodes = list(cluster.nodes) if hasattr(cluster, "nodes") else list(cluster)
        self._nodes = nodes
        self._num_accelerators = sum(n.num_gpus for n in nodes)
        self._on_accelerators = self._num_accelerators > 0
        self._resource = "GPU" if self._on_accelerators else "node"
        total = self._num_accelerators if self._on_accelerators else len(nodes)
        self._components: list[str] = []
        self._component_resources: dict[str, list[int]] = {}
        self._component_processes: dict[str, int] = {}
        self._placements: dict[str, PlacementStrategy] = {}
        for key, value in _items(placement_cfg):
            names = [c.strip() for c in str(key).split(",")]
            if not all(names):
                raise PlacementError(f"component_placement key {key!r} has an empty component name")
            resources, processes = self._parse_value(value, total, names)
            for name in names:
                if name in self._component_resources:
                    raise PlacementError(f"component {name!r} is placed more than once in component_placement")
                self._components.append(name)
                self._component_resources[name] = resources
                self._component_processes[name] = processes
                self._placements[name] = strategy = self._strategy(name, resources, processes)
                strategy.get_placement(nodes)  # fails now, naming the component's strategy, if it cannot fit
        self._placement_mode = self._detect_mode()

    # -- parsing ----------------------------------------------------------------------
    def _parse_value(self, value: Any, total: int, names: list[str]) -> tuple[list[int], int]:
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            node_group = _get(value, "node_group")
            if node_group is not None:
                raise PlacementError(
                    f"components {names}: node groups ({node_group!r}) are not supported; "
                    f"give global resource ranks instead"
                )
            value = _get(value, "placement")
            if value is None:
                raise PlacementError(f"components {names}: a dict entry needs a 'placement' field")
        text = str(value)
        res_text, _, proc_text = text.partition(":")
        resources = _parse_ranks(res_text, total, self._resource, names)
        if not proc_text:
            return resources, len(resources)
        procs = _parse_ranks(proc_text, None, "process", names)
        if sorted(procs) != list(range(len(procs))):
            raise PlacementError(f"components {names}: process ranks {proc_text!r} must be 0..N-1 without gaps")
        return resources, len(procs)

    def _strategy(self, name: str, resources: list[int], processes: int) -> PlacementStrategy:
        n = len(resources)
        if processes % n and n % processes:
            raise PlacementError(
                f"component {name!r}: {processes} processes do not spread evenly over {n} {self._resource}(s)"
            )
        if not self._on_accelerators:
            if processes < n:
                raise PlacementError(
                    f"component {name!r}: a process cannot span {n // processes} nodes (CPU-only cluster)"
                )
            return NodePlacementStrategy([node for node in resources for _ in range(processes // n)])
        if processes > n:
            raise PlacementError(
                f"component {name!r}: {processes // n} processes per accelerator; this scheduler gives each "
                f"accelerator to one process of a group"
            )
        per = n // processes
        if resources == list(range(resources[0], resources[0] + n)):
            return PackedPlacementStrategy(resources[0], resources[-1], num_hardware_per_process=per)
        return FlexiblePlacementStrategy([resources[i : i + per] for i in range(0, n, per)])

    def _detect_mode(self) -> PlacementMode:
        sets = [frozenset(r) for r in self._component_resources.values()]
        if len(set(sets)) <= 1:
            return PlacementMode.COLLOCATED
        if all(a.isdisjoint(b) for i, a in enumerate(sets) for b in sets[i + 1 :]):
            return PlacementMode.DISAGGREGATED
        return PlacementMode.HYBRID

    # -- queries (RLinf's names) --------------------------------------------------------
    def _check(self, component_name: str) -> None:
        if component_name not in self._placements:
            raise PlacementError(
                f"Component {component_name} does not exist in {type(self).__name__} with placement mode "
                f"{self._placement_mode}; known components: {self._components}"
            )

    @property
    def placement_mode(self) -> PlacementMode:
        """How the components share resources: ``COLLOCATED`` when all use the same set, ``DISAGGREGATED``
        when no two overlap, else ``HYBRID``."""
        return self._placement_mode

    @property
    def components(self) -> list[str]:
        """The component names of the config, in the order the config lists them (a copy)."""
        return list(self._components)

    def get_world_size(self, component_name: str) -> int:
        """How many processes (workers) the component has.

        Args:
            component_name: a component the config places (``"actor"``).

        Returns:
            The number of processes: the process ranks of its entry, else one per resource.

        Raises:
            PlacementError: the config does not place ``component_name`` (the message lists the components).
        """
        self._check(component_name)
        return self._component_processes[component_name]

    def get_hardware_ranks(self, component_name: str) -> list[int]:
        """The resource ranks (accelerators, or nodes on a CPU-only cluster) the component uses.

        Args:
            component_name: a component the config places.

        Returns:
            The global ranks, in the order its entry lists them (a copy).

        Raises:
            PlacementError: the config does not place ``component_name``.
        """
        self._check(component_name)
        return list(self._component_resources[component_name])

    def get_strategy(self, component_name: str) -> PlacementStrategy:
        """The placement strategy to ``launch`` the component's group with.

        Args:
            component_name: a component the config places.

        Returns:
            A ``PackedPlacementStrategy`` for a contiguous range of accelerators, a
            ``FlexiblePlacementStrategy`` otherwise, a ``NodePlacementStrategy`` on a CPU-only cluster.

        Raises:
            PlacementError: the config does not place ``component_name``.
        """
        self._check(component_name)
        return self._placements[component_name]


class HybridComponentPlacement(ComponentPlacement):
    """RLinf's hybrid placement: components on any sets of resources, shared or not.

    Parses the config as ``ComponentPlacement`` does; only ``placement_mode``
    differs: always ``PlacementMode.HYBRID``, whatever the resources overlap.

    Args:
        config: the config holding ``cluster.component_placement``, its ``cluster`` section, or None (the
            cluster's own config).
        cluster (Cluster | list[NodeInfo]): the ``Cluster``, or a list of ``NodeInfo``.

    Raises:
        PlacementError: as ``ComponentPlacement``.

    Example:
        ```python
        placement = HybridComponentPlacement(cfg, cluster)  # cfg.cluster.component_placement: {env: 0-3, ...}
        env = Env.create_group(cfg).launch(cluster, placement.get_strategy("env"), name="env")
        ```
    """

    def __init__(self, config: Any, cluster):
        super().__init__(config, cluster)
        self._placement_mode = PlacementMode.HYBRID
