"""RLinf's ``rlinf.scheduler.cluster.config`` path: the ``cluster`` config section's dataclasses."""

from ..plugins.cluster_config import ClusterConfig, NodeGroupConfig, NodeGroupEnvConfig

__all__ = ["ClusterConfig", "NodeGroupConfig", "NodeGroupEnvConfig"]
