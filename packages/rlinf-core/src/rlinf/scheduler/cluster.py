"""``rlinf.scheduler.cluster``: RLinf's import path of ``Cluster`` (it lives in ``runtime.cluster``) and of
``ClusterConfig`` / ``NodeGroupConfig`` (RLinf's ``cluster`` config section, in ``plugins.cluster_config``)."""

from .plugins.cluster_config import (
    ClusterConfig,
    NodeGroupConfig,
    NodeGroupEnvConfig,
    dataclass_arg_check,
    parse_rank_config,
)
from .runtime.cluster import Cluster

__all__ = ["Cluster", "ClusterConfig", "NodeGroupConfig", "NodeGroupEnvConfig", "dataclass_arg_check",
           "parse_rank_config"]
