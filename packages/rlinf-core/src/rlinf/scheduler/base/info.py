"""Runtime facts about one worker, gathered where it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .address import WorkerAddress


@dataclass
class WorkerInfo:
    """What a worker is and where it runs.

    ``node_id`` is the node's rank in the cluster (node 0 first), ``gpu_id`` the
    first global accelerator rank given to the worker (``None`` on CPU), and
    ``available_gpus`` the CUDA device ids the worker can see (``[]`` on CPU).
    RLinf's fields are all here (``cluster_node_rank``, ``available_accelerators``
    and ``num_accelerators`` as properties over the seed's); the ones added
    after the seed's have defaults, so a record built with the seed's fields
    only is valid.

    Attributes:
        address: the worker's ``WorkerAddress``.
        rank: its rank in its group.
        node_id: its node's rank in the cluster.
        gpu_id: its first global accelerator rank, or None.
        node_ip: its node's IP address.
        available_gpus: the device ids it can see.
        pid: its process id.
        hostname: its node's host name.
        group_world_size: how many workers its group has.
        local_rank: its rank among its group's workers on its node.
        local_world_size: how many workers of its group its node runs.
        accelerator_type: ``"NV_GPU"``, ``"NO_ACCEL"``, ... (RLinf's names).
        accelerator_model: the accelerator's model as the node reports it ("" when unknown).
        accelerator_rank: the node-local index of its first accelerator (-1 without one).
        node_port: a port its node offers it (0 when none was reserved).
        hardware_infos: ``HardwareInfo`` records of the hardware it was placed on.
    """

    address: WorkerAddress
    rank: int
    node_id: int
    gpu_id: Optional[int]
    node_ip: str
    available_gpus: list[int] = field(default_factory=list)
    pid: int = 0
    hostname: str = ""
    #: RLinf's fields besides the seed's
    group_world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    accelerator_type: str = "NO_ACCEL"
    #: the accelerator's model as the node reports it ("" when unknown)
    accelerator_model: str = ""
    #: the node-local index of the worker's first accelerator (-1 without one); RLinf's ``accelerator_rank``
    accelerator_rank: int = -1
    #: a port the worker's node offers it (0 when none was reserved); RLinf's ``node_port``
    node_port: int = 0
    #: ``HardwareInfo`` records of the hardware the worker was placed on (its robots or accelerators, from
    #: the cluster's node records: ``WorkerPlacement.hardware_infos``); ``[]`` when none or unknown
    hardware_infos: list = field(default_factory=list)

    @property
    def cluster_node_rank(self) -> int:
        """RLinf's name for ``node_id``: the node's rank in the cluster."""
        return self.node_id

    @property
    def node_rank(self) -> int:
        """The node's rank in the cluster (``node_id``)."""
        return self.node_id

    @property
    def available_accelerators(self) -> list[int]:
        """RLinf's name for ``available_gpus``."""
        return self.available_gpus

    @property
    def num_accelerators(self) -> int:
        """How many accelerators the worker can see."""
        return len(self.available_gpus)

    def describe(self) -> str:
        """Human-readable location used in every error message."""
        return (
            f"group {self.address.group_key!r} rank {self.rank} "
            f"(worker {self.address.get_name()!r}, node {self.node_id}, {self.node_ip}, pid {self.pid})"
        )
