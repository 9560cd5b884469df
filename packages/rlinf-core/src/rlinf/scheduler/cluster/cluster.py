"""RLinf's ``rlinf.scheduler.cluster.cluster`` path: ``Cluster``, ``ClusterEnvVar``, ``PathEnvMergeMode``."""

from ..runtime.cluster import Cluster
from ..runtime.cluster_helpers import ClusterEnvVar, PathEnvMergeMode

__all__ = ["Cluster", "ClusterEnvVar", "PathEnvMergeMode"]
