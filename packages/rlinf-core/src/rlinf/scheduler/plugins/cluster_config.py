"""RLinf's ``cluster`` config section, parsed and checked: ``ClusterConfig`` and its node groups.

::

    cluster:
      num_nodes: 3
      component_placement: {actor: all}
      node_groups:
        - label: gpu
          node_ranks: 0-1
          env_configs:
            - node_ranks: 1
              python_interpreter_path: /opt/venv/bin/python
              env_vars:
                - GLOO_SOCKET_IFNAME: eth0
        - label: franka
          node_ranks: 2
          hardware:
            type: Franka                  # a hardware kind from a plugin
            configs:
              - {node_rank: 2, robot_ip: 10.10.10.1}

Everything RLinf checks is checked here, with messages naming the entry:
missing and unknown fields, rank ranges (``"0-3,5"``, ``"all"``) inside the
cluster, reserved and duplicate labels, env configs inside their group and
not overlapping, one-key env var entries without duplicates, hardware entries
on the group's nodes and not claimed by two groups.  Errors are
``ClusterConfigError`` (a ``ValueError`` and an ``AssertionError``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from ..base.errors import ClusterConfigError
from . import hardware as _hardware

#: node group labels the scheduler owns: every node ("cluster"), every node without hardware ("node")
DEFAULT_GROUP_LABEL = "cluster"
NODE_PLACEMENT_GROUP_LABEL = "node"
RESERVED_LABELS = (DEFAULT_GROUP_LABEL, NODE_PLACEMENT_GROUP_LABEL)


def to_plain(value: Any) -> Any:
    """``value`` with OmegaConf containers turned into dicts and lists (plain values unchanged)."""
    try:
        from omegaconf import OmegaConf
    except ImportError:
        OmegaConf = None
    if OmegaConf is not None and OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def _is_mapping(value: Any) -> bool:
    return hasattr(value, "keys") and hasattr(value, "__getitem__")


def _is_list(value: Any) -> bool:
    return isinstance(value, (list, tuple))


def dataclass_arg_check(cls: type, kwargs: Any, no_check_unknown: bool = False, error_suffix: str = ""):
    """Check that ``kwargs`` has every required field of dataclass ``cls`` and (unless told) no other.

    Returns:
        ``(missing_required, unknown, valid)`` field names.

    Raises:
        ClusterConfigError: ``kwargs`` is not a mapping, misses a required field or has an unknown one.
    """
    if not _is_mapping(kwargs):
        raise ClusterConfigError(f"expected a mapping {error_suffix}, got {type(kwargs).__name__}: {kwargs!r}")
    given = set(kwargs.keys())
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    missing = sorted(
        name for name, f in fields.items()
        if name not in given and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    )
    unknown = sorted(given - set(fields))
    if missing:
        raise ClusterConfigError(f"Missing fields {missing} {error_suffix}; got only {sorted(given)}.")
    if unknown and not no_check_unknown:
        raise ClusterConfigError(f"Unknown fields {unknown} {error_suffix}; valid fields are {sorted(fields)}.")
    return missing, unknown, set(fields)


def parse_rank_config(rank_config: Any, available_ranks: Optional[Sequence[int]] = None,
                      rank_type: Optional[str] = None) -> list[int]:
    """Ranks from ``"0-3,5"``, ``"all"``, an int or a list of ints, sorted and without duplicates.

    Args:
        rank_config: the expression.
        available_ranks: the ranks it may name (required for ``"all"``).
        rank_type: what the ranks are, for messages (``"node"``).

    Raises:
        ClusterConfigError: a malformed expression, a range whose end is before its start, or a rank outside
            ``available_ranks``.
    """
    what = rank_type or "rank"
    avail = sorted(set(available_ranks)) if available_ranks is not None else None
    if _is_list(rank_config):
        parts = [str(r) for r in rank_config]
    elif isinstance(rank_config, bool) or rank_config is None:
        raise ClusterConfigError(f"Invalid {what} ranks {rank_config!r}, expected format: \"a,b,c-d\" or \"all\"")
    else:
        text = str(rank_config).strip()
        if text.lower() == "all":
            if avail is None:
                raise ClusterConfigError(f'"all" {what} ranks need the available ranks to be known')
            return list(avail)
        parts = text.split(",")
    ranks: set[int] = set()
    for part in (p.strip() for p in parts):
        if not part:
            continue
        bounds = part.split("-")
        try:
            if len(bounds) > 2:
                raise ValueError
            start, end = int(bounds[0]), int(bounds[-1])
        except ValueError:
            raise ClusterConfigError(
                f"Invalid {what} rank format {rank_config!r}, expected format: \"a,b,c-d\" or \"all\""
            ) from None
        if end < start:
            raise ClusterConfigError(
                f"Start {what} rank {start} must be less than or equal to end rank {end} in {rank_config!r}."
            )
        if avail is not None and (not avail or start < avail[0] or end > avail[-1]):
            raise ClusterConfigError(
                f"{what.capitalize()} ranks {start}-{end} in {rank_config!r} must be within the available "
                f"{what} ranks {avail}."
            )
        ranks.update(range(start, end + 1))
    if avail is not None and not ranks.issubset(avail):
        raise ClusterConfigError(f"{what.capitalize()} ranks {sorted(ranks - set(avail))} are not among {avail}.")
    return sorted(ranks)


@dataclass
class NodeGroupEnvConfig:
    """The software environment of some nodes of a group: env vars and the Python interpreter.

    Args:
        node_ranks: the nodes (a subset of the group's), as a rank expression or list.
        env_vars: one-key dicts ``[{NAME: value}, ...]`` set on those nodes' workers.
        python_interpreter_path: the interpreter for workers on those nodes.

    Raises:
        ClusterConfigError: ``env_vars`` is not a list of one-key mappings.
    """

    node_ranks: Any
    env_vars: Optional[list] = None
    python_interpreter_path: Optional[str] = None

    def __post_init__(self):
        if self.env_vars is not None:
            if not _is_list(self.env_vars):
                raise ClusterConfigError(
                    f"env_vars must be a list of one-key dicts, got {self.env_vars!r}; perhaps a '-' is missing "
                    f"before each variable in the yaml?"
                )
            pairs = []
            for item in self.env_vars:
                if not _is_mapping(item) or len(item) != 1:
                    raise ClusterConfigError(f"each env_vars entry must be a dict with exactly one key, got {item!r}")
                ((key, value),) = item.items()
                pairs.append({str(key): str(value)})
            self.env_vars = pairs
        if self.python_interpreter_path is not None:
            self.python_interpreter_path = str(self.python_interpreter_path)


@dataclass
class NodeHardwareConfig:
    """The hardware of a node group: one kind (``type``, from a hardware plugin) and one entry per device.

    Raises:
        ClusterConfigError: the type is not installed, an entry is not a mapping, misses or adds fields,
            or two entries are identical.
    """

    type: str
    configs: list

    def __post_init__(self):
        kind = _hardware.get(str(self.type))
        self.type = kind.name
        if not _is_list(self.configs):
            raise ClusterConfigError(f"hardware.configs of type {self.type!r} must be a list, got {self.configs!r}")
        seen = []
        built = []
        for entry in self.configs:
            if isinstance(entry, kind.config_class):
                built.append(entry)
                continue
            dataclass_arg_check(kind.config_class, entry, error_suffix=f"in {self.type} hardware config {entry!r}")
            plain = dict(entry)
            if plain in seen:
                raise ClusterConfigError(f"Duplicate hardware configs of type {self.type!r}: {plain!r}")
            seen.append(plain)
            try:
                built.append(kind.config_class(**plain))
            except ClusterConfigError:
                raise
            except (ValueError, TypeError, AssertionError) as exc:
                raise ClusterConfigError(f"{self.type} hardware config {plain!r}: {exc}") from exc
        self.configs = built


@dataclass
class NodeGroupConfig:
    """A labelled set of nodes with the same hardware and, per subset, the same software environment.

    Args:
        label: the group's name, used by placements (``node_group_label=``); not ``cluster`` or ``node``.
        node_ranks: the group's nodes (a rank expression, parsed against the cluster by ``ClusterConfig``).
        env_configs: ``NodeGroupEnvConfig`` entries (mappings are built).
        hardware: a ``NodeHardwareConfig`` (a mapping is built).
        hardware_type: set from ``hardware``; giving it yourself is refused.
        ignore_hardware: treat the nodes as CPU-only (no hardware may then be given).

    Raises:
        ClusterConfigError: a reserved label, a malformed entry, or conflicting hardware settings.
    """

    label: str
    node_ranks: Any
    env_configs: Optional[list] = None
    hardware: Optional[NodeHardwareConfig] = None
    hardware_type: Optional[str] = None
    ignore_hardware: bool = False

    def __post_init__(self):
        self.label = str(self.label)
        if not self.label:
            raise ClusterConfigError("a node group label must not be empty")
        if self.label in RESERVED_LABELS:
            raise ClusterConfigError(
                f"Node group label {self.label!r} is reserved by the scheduler ({list(RESERVED_LABELS)}); "
                f"choose another label."
            )
        where = f"in node group {self.label!r}"
        if self.hardware is not None:
            if self.hardware_type is not None:
                raise ClusterConfigError(f"hardware_type must not be given {where}: it comes from hardware.type")
            if not isinstance(self.hardware, NodeHardwareConfig):
                dataclass_arg_check(NodeHardwareConfig, self.hardware, error_suffix=f"in the hardware config {where}")
                self.hardware = NodeHardwareConfig(**dict(self.hardware))
            self.hardware_type = self.hardware.type
            if self.ignore_hardware:
                raise ClusterConfigError(f"hardware cannot be given {where} when ignore_hardware is true")
        if self.env_configs is not None:
            if not _is_list(self.env_configs):
                raise ClusterConfigError(
                    f"env_configs {where} must be a list of dicts, got {self.env_configs!r}; perhaps a '-' is "
                    f"missing before node_ranks in the yaml?"
                )
            built = []
            for entry in self.env_configs:
                if not isinstance(entry, NodeGroupEnvConfig):
                    dataclass_arg_check(NodeGroupEnvConfig, entry, error_suffix=f"in an env_configs entry {where}")
                    entry = NodeGroupEnvConfig(**dict(entry))
                built.append(entry)
            self.env_configs = built

    def _resolve(self, num_nodes: int) -> None:
        """Parse the group's and its env configs' node ranks against the cluster, and check them."""
        try:
            self.node_ranks = parse_rank_config(self.node_ranks, range(num_nodes), "node")
        except ClusterConfigError as exc:
            raise ClusterConfigError(f"node_ranks of node group {self.label!r}: {exc}") from None
        claimed: set[int] = set()
        env_keys: set[str] = set()
        for env in self.env_configs or []:
            try:
                env.node_ranks = parse_rank_config(env.node_ranks, self.node_ranks, "node")
            except ClusterConfigError as exc:
                raise ClusterConfigError(
                    f"node_ranks of an env_configs entry of node group {self.label!r} must be within the group's "
                    f"nodes {self.node_ranks}: {exc}"
                ) from None
            overlap = claimed.intersection(env.node_ranks)
            if overlap:
                raise ClusterConfigError(
                    f"Node ranks {sorted(overlap)} appear in several env_configs of node group {self.label!r}."
                )
            claimed.update(env.node_ranks)
            for pair in env.env_vars or []:
                for key in pair:
                    if key in env_keys:
                        raise ClusterConfigError(
                            f"Environment variable {key!r} is set twice in env_configs of node group {self.label!r}."
                        )
                    env_keys.add(key)
        for cfg in self.hardware.configs if self.hardware is not None else []:
            if cfg.node_rank not in self.node_ranks:
                raise ClusterConfigError(
                    f"node_rank {cfg.node_rank} in a {self.hardware.type} hardware config must be within node_ranks "
                    f"{self.node_ranks} of node group {self.label!r}."
                )

    def get_node_env_vars(self, node_rank: int) -> dict[str, str]:
        """The env vars the group's env configs set on node ``node_rank`` (``{}`` when none)."""
        out: dict[str, str] = {}
        for env in self.env_configs or []:
            if node_rank in env.node_ranks:
                for pair in env.env_vars or []:
                    out.update(pair)
        return out

    def get_node_python_interpreter_path(self, node_rank: int) -> Optional[str]:
        """The interpreter the group's env configs give node ``node_rank``, or None."""
        for env in self.env_configs or []:
            if node_rank in env.node_ranks and env.python_interpreter_path is not None:
                return env.python_interpreter_path
        return None


@dataclass
class ClusterConfig:
    """RLinf's ``cluster`` section: ``num_nodes``, ``component_placement``, ``node_groups`` (and ``profiling``).

    Build it with ``ClusterConfig.from_dict_cfg(section)`` (a dict or an
    OmegaConf ``DictConfig``; other top-level keys are ignored, as in RLinf) or
    directly with the fields.  ``profiling`` is kept as given (no profiler
    backend is driven by rlinf).

    Raises:
        ClusterConfigError: any check of the module docstring fails.
    """

    num_nodes: int
    component_placement: Any = None
    node_groups: Optional[list] = None
    profiling: Any = None

    @staticmethod
    def from_dict_cfg(cfg_dict: Any) -> "ClusterConfig":
        """The ``ClusterConfig`` of a ``cluster`` section; unknown top-level keys are ignored.

        Args:
            cfg_dict: the section, a dict or an OmegaConf ``DictConfig``.

        Raises:
            ClusterConfigError: the section is invalid (a missing or mistyped field, a bad node group).

        Example:
            ```python
            config = ClusterConfig.from_dict_cfg({"num_nodes": 2, "component_placement": {"actor": "0-15"}})
            ```
        """
        cfg = to_plain(cfg_dict)
        _, _, valid = dataclass_arg_check(ClusterConfig, cfg, no_check_unknown=True, error_suffix="in cluster_cfg")
        return ClusterConfig(**{k: cfg[k] for k in valid if k in cfg})

    def __post_init__(self):
        if isinstance(self.num_nodes, bool) or not isinstance(self.num_nodes, int) or self.num_nodes < 1:
            raise ClusterConfigError(f"cluster_cfg.num_nodes must be a positive integer, got {self.num_nodes!r}")
        self.component_placement = to_plain(self.component_placement)
        if self.node_groups is None:
            return
        groups = to_plain(self.node_groups)
        if not _is_list(groups):
            raise ClusterConfigError(f"cluster_cfg.node_groups must be a list of node groups, got {groups!r}")
        built = []
        for i, entry in enumerate(groups):
            if not isinstance(entry, NodeGroupConfig):
                dataclass_arg_check(NodeGroupConfig, entry, error_suffix=f"in cluster_cfg.node_groups[{i}]")
                entry = NodeGroupConfig(**dict(entry))
            built.append(entry)
        labels = [g.label for g in built]
        duplicates = sorted({label for label in labels if labels.count(label) > 1})
        if duplicates:
            raise ClusterConfigError(f"cluster_cfg.node_groups labels must be unique; repeated: {duplicates}")
        claimed: dict[tuple[int, str], str] = {}
        for group in built:
            group._resolve(self.num_nodes)
            for cfg in group.hardware.configs if group.hardware is not None else []:
                key = (cfg.node_rank, group.hardware.type)
                other = claimed.setdefault(key, group.label)
                if other != group.label:
                    raise ClusterConfigError(
                        f"Cannot have {group.hardware.type!r} hardware of node {cfg.node_rank} in two node groups "
                        f"({other!r} and {group.label!r})."
                    )
        self.node_groups = built

    @property
    def labels(self) -> list[str]:
        """The labels of the configured node groups, in order."""
        return [g.label for g in self.node_groups or []]

    def get_node_group(self, label: str) -> Optional[NodeGroupConfig]:
        """The node group with this label, or None.

        Args:
            label: the node group's ``label``.
        """
        return next((g for g in self.node_groups or [] if g.label == label), None)

    def get_node_labels_by_rank(self, node_rank: int) -> list[str]:
        """Labels of the node groups node ``node_rank`` belongs to (``[]`` when none).

        Args:
            node_rank: the node's rank in the cluster (``0 .. num_nodes - 1``).
        """
        return [g.label for g in self.node_groups or [] if node_rank in g.node_ranks]

    def get_node_python_interpreter_path_by_rank(self, node_rank: int) -> list[str]:
        """Every interpreter path the node groups' ``env_configs`` give node ``node_rank``.

        Args:
            node_rank: the node's rank in the cluster (``0 .. num_nodes - 1``).
        """
        out = []
        for g in self.node_groups or []:
            for env in g.env_configs or []:
                if node_rank in env.node_ranks and env.python_interpreter_path is not None:
                    out.append(env.python_interpreter_path)
        return out

    def get_node_hw_configs_by_rank(self, node_rank: int) -> list:
        """Every hardware config entry attached to node ``node_rank``, across node groups.

        Args:
            node_rank: the node's rank in the cluster (``0 .. num_nodes - 1``).
        """
        out = []
        for g in self.node_groups or []:
            if g.hardware is not None and node_rank in g.node_ranks:
                out.extend(c for c in g.hardware.configs if c.node_rank == node_rank)
        return out

    def get_node_hw_configs_by_type(self, node_rank: int) -> dict[str, list]:
        """Node ``node_rank``'s hardware config entries grouped by hardware type.

        Args:
            node_rank: the node's rank in the cluster (``0 .. num_nodes - 1``).
        """
        out: dict[str, list] = {}
        for g in self.node_groups or []:
            if g.hardware is not None:
                mine = [c for c in g.hardware.configs if c.node_rank == node_rank]
                if mine:
                    out.setdefault(g.hardware.type, []).extend(mine)
        return out

    def to_dict(self) -> dict:
        """The section as plain data (dataclasses turned into dicts)."""
        return dataclasses.asdict(self)


__all__ = [
    "ClusterConfig",
    "NodeGroupConfig",
    "NodeGroupEnvConfig",
    "NodeHardwareConfig",
    "dataclass_arg_check",
    "parse_rank_config",
    "RESERVED_LABELS",
]
