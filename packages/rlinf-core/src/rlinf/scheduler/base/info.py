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

    @property
    def cluster_node_rank(self) -> int:
        """RLinf's name for ``node_id``: the node's rank in the cluster."""
        return self.node_id

    @property
    def node_rank(self) -> int:
        return self.node_id

    @property
    def available_accelerators(self) -> list[int]:
        """RLinf's name for ``available_gpus``."""
        return self.available_gpus

    @property
    def num_accelerators(self) -> int:
        return len(self.available_gpus)

    def describe(self) -> str:
        """Human-readable location used in every error message."""
        return (
            f"group {self.address.group_key!r} rank {self.rank} "
            f"(worker {self.address.get_name()!r}, node {self.node_id}, {self.node_ip}, pid {self.pid})"
        )
