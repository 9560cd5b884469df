"""rlinf.scheduler: workers, groups, placement, timing, point-to-point and channels.

The public API mirrors the RLinf scheduler so that programs written for it
run unchanged; launchers and transports are plugins (see ``plugins.hookspecs``).
"""

from .base.address import WorkerAddress
from .channel import Channel
from .runtime.cluster import Cluster
from .plugins.component_placement import ComponentPlacement, HybridComponentPlacement, PlacementMode
from .base.errors import CommTimeoutError, CommunicationError, GroupNameError, LaunchError, PeerDiedError, PlacementError, PluginError, RlinfError, WorkerDiedError, WorkerError, WorkerMethodError
from .runtime.group import WorkerGroup, WorkerGroupFuncResult
from .base.info import WorkerInfo
from .plugins.options import CollectiveGroupOptions
from .plugins.placement import FlexiblePlacementStrategy, NodePlacementStrategy, PackedPlacementStrategy, PlacementStrategy
from .worker import Worker

__all__ = [
    "Channel",
    "Cluster",
    "CollectiveGroupOptions",
    "CommTimeoutError",
    "CommunicationError",
    "ComponentPlacement",
    "HybridComponentPlacement",
    "PlacementMode",
    "FlexiblePlacementStrategy",
    "GroupNameError",
    "LaunchError",
    "NodePlacementStrategy",
    "PackedPlacementStrategy",
    "PeerDiedError",
    "PlacementError",
    "PlacementStrategy",
    "PluginError",
    "RlinfError",
    "Worker",
    "WorkerAddress",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerGroupFuncResult",
    "WorkerInfo",
    "WorkerMethodError",
]
