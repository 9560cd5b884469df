"""rlinf.scheduler: workers, groups, placement, timing, point-to-point and channels.

The public API mirrors the RLinf scheduler so that programs written for it
run unchanged; launchers and transports are plugins (see ``plugins.hookspecs``).
"""

from .base.address import WorkerAddress
from .base.errors import (
    ClusterConfigError,
    CommTimeoutError,
    CommunicationError,
    GroupNameError,
    LaunchError,
    PeerDiedError,
    PlacementArgumentError,
    PlacementError,
    PluginError,
    RlinfError,
    WorkerDiedError,
    WorkerError,
    WorkerMethodError,
)
from .base.info import WorkerInfo
from .base.unpicklable import UnpicklableError
from .channel import Channel, ChannelWorker, WeightedItem
from .cluster import Cluster, ClusterConfig
from .hardware import (
    AcceleratorType,
    AcceleratorUtil,
    DOSW1HWInfo,
    DualFrankaHWInfo,
    FrankaHWInfo,
    GimArmHWInfo,
    HardwareInfo,
    Turtle2HWInfo,
)
from .manager import Tracer
from .placement import (
    ComponentPlacement,
    FlexiblePlacementStrategy,
    HybridComponentPlacement,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementMode,
    PlacementStrategy,
)
from .plugins.options import CollectiveGroupOptions
from .runtime.group import WorkerGroup, WorkerGroupFuncResult
from .worker import Worker
from .worker.routing import (
    CommMapper,
    build_recv_plan,
    build_route_channel_key,
    build_send_key,
    build_send_plan,
    decoupled_build_recv_plan,
    get_batch_size,
    get_group_world_size,
    infer_batch_size,
    merge_batches,
    split_batch,
    split_channel_message,
)

#: the names of RLinf's ``rlinf.scheduler.__all__`` (its main branch: 36), each with RLinf's signature
NAMES_FROM_RLINF = (
    "AcceleratorType", "AcceleratorUtil", "Channel", "ChannelWorker", "Cluster", "ClusterConfig",
    "CollectiveGroupOptions", "CommMapper", "ComponentPlacement", "DOSW1HWInfo", "DualFrankaHWInfo",
    "FlexiblePlacementStrategy", "FrankaHWInfo", "GimArmHWInfo", "HardwareInfo", "NodePlacementStrategy",
    "PackedPlacementStrategy", "PlacementStrategy", "Tracer", "Turtle2HWInfo", "WeightedItem", "Worker",
    "WorkerAddress", "WorkerGroupFuncResult", "WorkerInfo", "build_recv_plan", "build_route_channel_key",
    "build_send_key", "build_send_plan", "decoupled_build_recv_plan", "get_batch_size", "get_group_world_size",
    "infer_batch_size", "merge_batches", "split_batch", "split_channel_message",
)

__all__ = sorted(set(NAMES_FROM_RLINF) | {
    "ClusterConfigError",
    "CommTimeoutError",
    "CommunicationError",
    "GroupNameError",
    "HybridComponentPlacement",
    "LaunchError",
    "PeerDiedError",
    "PlacementArgumentError",
    "PlacementError",
    "PlacementMode",
    "PluginError",
    "RlinfError",
    "UnpicklableError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroup",
    "WorkerMethodError",
})
