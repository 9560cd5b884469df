"""``rlinf.scheduler.worker``: the ``Worker`` base class and its group, at RLinf's import paths.

RLinf programs import ``rlinf.scheduler.worker.worker.Worker`` and
``rlinf.scheduler.worker.worker_group.WorkerGroup``; both are the very objects
``rlinf.scheduler`` exports.

Layer: the public API.  It may import ``runtime`` and every layer below; the
channel API above it registers itself (``worker.provide_channels``).
"""

from ..base.address import WorkerAddress
from ..base.info import WorkerInfo
from .routing import (
    CommMapper,
    DecoupledRouteEntry,
    RouteEntry,
    RoutePlan,
    _build_channel_message,
    build_recv_plan,
    build_route_channel_key,
    build_send_key,
    build_send_plan,
    decoupled_build_recv_plan,
    decoupled_build_send_plan,
    get_batch_size,
    get_group_info,
    get_group_world_size,
    infer_batch_size,
    merge_batches,
    split_batch,
    split_channel_message,
    validate_batch_size,
)
from .worker import Worker
from .worker_group import WorkerGroup, WorkerGroupFuncResult

__all__ = [
    "CommMapper",
    "DecoupledRouteEntry",
    "RouteEntry",
    "RoutePlan",
    "Worker",
    "WorkerAddress",
    "WorkerGroup",
    "WorkerGroupFuncResult",
    "WorkerInfo",
    "build_recv_plan",
    "build_route_channel_key",
    "build_send_key",
    "build_send_plan",
    "decoupled_build_recv_plan",
    "decoupled_build_send_plan",
    "get_batch_size",
    "get_group_info",
    "get_group_world_size",
    "infer_batch_size",
    "merge_batches",
    "split_batch",
    "split_channel_message",
    "validate_batch_size",
]
