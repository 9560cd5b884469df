"""``rlinf.scheduler.cluster``: RLinf's import paths of ``Cluster`` and its helpers.

``Cluster`` lives in ``runtime.cluster``; ``ClusterConfig`` / ``NodeGroupConfig`` (RLinf's ``cluster``
config section) in ``plugins.cluster_config``; RLinf's ``cluster.utils`` (``load_user_extension_module``,
``parse_rank_config``, ...) in ``cluster.utils``.  Importing this package also provides
``Cluster.allocate`` (``cluster.allocation``), which launches through the groups above the runtime.

Layer: the public API; it may import ``runtime`` and the layers below.
"""

from ..plugins.cluster_config import ClusterConfig, NodeGroupConfig, NodeGroupEnvConfig
from ..plugins.placement import NodeInfo
from ..runtime.cluster import Cluster
from ..runtime.cluster_helpers import ClusterEnvVar, PathEnvMergeMode, ProfileSettings
from . import allocation  # noqa: F401  (registers Cluster.allocate)
from .utils import dataclass_arg_check, load_user_extension_module, parse_rank_config, without_http_proxies

__all__ = ["Cluster", "ClusterConfig", "ClusterEnvVar", "NodeGroupConfig", "NodeGroupEnvConfig", "NodeInfo",
           "PathEnvMergeMode", "ProfileSettings", "dataclass_arg_check", "load_user_extension_module",
           "parse_rank_config", "without_http_proxies"]
