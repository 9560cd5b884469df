"""Hardware kinds: what is attached to each node, as RLinf's ``HardwareInfo`` / ``HardwareResource``.

Two sources describe a node's hardware:

* accelerators, counted by the launcher (``NodeInfo.num_gpus``, its kind
  ``NodeInfo.accelerator``), give one ``HardwareResource`` of type
  ``"Accelerator"`` (RLinf's name) with one info per device, model
  ``"<AcceleratorType>:<kind>"`` (``"NV_GPU:nvidia"``);
* other hardware (robots, ...) comes from ``HardwarePlugin`` descriptors
  (hook ``rlinf_register_hardware``), named in the cluster config's
  ``node_groups[].hardware``; each kind's ``enumerate`` turns the configs of a
  node into its infos.

This module owns the base dataclasses plugins build on (``HardwareConfig``,
``HardwareInfo``, ``HardwareResource``) and the lookup of a kind by the name a
config gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from ..base.errors import ClusterConfigError, PluginError
from .descriptors import HardwarePlugin

#: RLinf's hardware type of accelerators (``Accelerator.HW_TYPE``)
ACCELERATOR_HW_TYPE = "Accelerator"


@dataclass
class HardwareConfig:
    """Base of a hardware kind's config entry: the node the device is attached to.

    Args:
        node_rank: the rank of that node in the cluster.

    Raises:
        ClusterConfigError: ``node_rank`` is not an int.
    """

    node_rank: int

    def __post_init__(self):
        if isinstance(self.node_rank, bool) or not isinstance(self.node_rank, int):
            raise ClusterConfigError(
                f"'node_rank' in a {type(self).__name__} must be an integer, got {self.node_rank!r}"
            )


@dataclass
class HardwareInfo:
    """One device on a node (RLinf's ``HardwareInfo``): the base of every kind's info dataclass.

    A worker placed on hardware receives the infos of its devices
    (``WorkerPlacement.hardware_infos``); a robot kind subclasses this with a
    ``config`` field holding the device's config entry.

    Args:
        type: the hardware type (``"Accelerator"``, ``"Franka"``, ...), as ``HardwareResource.type``.
        model: the device's model (``"NV_GPU:nvidia"`` for an accelerator; a robot kind's name or variant).
    """

    type: str
    model: str


@dataclass
class HardwareResource:
    """The devices of one type on one node (RLinf's ``HardwareResource``); ``count`` is how many."""

    type: str
    infos: list

    @property
    def count(self) -> int:
        """How many devices of this type the node has."""
        return len(self.infos)


def kinds() -> list[HardwarePlugin]:
    """Usable hardware kinds, highest priority first."""
    from . import get_registry

    entries = [p for p in get_registry().provided["hardware"].values() if not p.unusable_reason()]
    return [p.descriptor for p in sorted(entries, key=lambda p: (-p.descriptor.priority, p.name))]


def get(name: str) -> HardwarePlugin:
    """The hardware kind a config names: the exact name, else the only case-insensitive match.

    Raises:
        ClusterConfigError: no installed plugin provides that name (the message lists the installed ones),
            or several differ only in case.
        PluginError: the kind is installed but unusable here (a name conflict, a failed check).
    """
    from . import get_registry

    table = get_registry().provided["hardware"]
    entry = table.get(name)
    if entry is None:
        folded = [e for n, e in table.items() if n.lower() == str(name).lower()]
        if len(folded) > 1:
            raise ClusterConfigError(f"hardware type {name!r} is ambiguous: {sorted(e.name for e in folded)}")
        entry = folded[0] if folded else None
    if entry is None:
        raise ClusterConfigError(
            f"Unsupported hardware type: {name!r}. Installed hardware types: {sorted(table) or 'none'} "
            f"(hardware kinds come from plugins: hook rlinf_register_hardware)"
        )
    reason = entry.unusable_reason()
    if reason:
        raise PluginError(f"hardware {entry.name!r} from {entry.source.distribution} is not usable here: {reason}")
    return entry.descriptor


def accelerator_resource(num_devices: int, kind_name: str, rlinf_type: str) -> Optional[HardwareResource]:
    """The ``"Accelerator"`` resource of a node with ``num_devices`` devices of a kind; None without any."""
    if num_devices <= 0:
        return None
    model = f"{rlinf_type}:{kind_name}"
    return HardwareResource(ACCELERATOR_HW_TYPE, [HardwareInfo(ACCELERATOR_HW_TYPE, model) for _ in range(num_devices)])


def enumerate_node(node_rank: int, configs_by_type: dict, accelerator: Optional[HardwareResource] = None,
                   ignore: Sequence[str] = ()) -> list[HardwareResource]:
    """Every hardware resource of node ``node_rank``: its accelerators, then each configured kind's devices.

    Args:
        node_rank: the node's rank in the cluster.
        configs_by_type: hardware type name -> this node's config objects of that type.
        accelerator: the node's accelerator resource (``accelerator_resource``), if any.
        ignore: hardware types not to enumerate.

    Raises:
        ClusterConfigError: a kind's ``enumerate`` refused the configs (the message names the node and kind).
    """
    out = [accelerator] if accelerator is not None and accelerator.count else []
    for type_name, configs in configs_by_type.items():
        if type_name in ignore:
            continue
        kind = get(type_name)
        try:
            infos = kind.enumerate_node(node_rank, list(configs))
        except ClusterConfigError:
            raise
        except Exception as exc:
            raise ClusterConfigError(
                f"hardware {kind.name!r} on node {node_rank}: {type(exc).__name__}: {exc}"
            ) from exc
        if infos:
            out.append(HardwareResource(kind.name, infos))
    return out
