"""RLinf's ``rlinf.scheduler.cluster.node`` path: ``NodeInfo``.

``NodeInfo`` is this project's node record (rank, IP, accelerators, hardware; ``Cluster.nodes``), not RLinf's
dataclass of the same name: RLinf's ``NodeGroupInfo`` and ``NodeProbe`` (its per-node probe actor) have no
counterpart, node groups being read from the config (``Cluster.get_node_group``, ``NodeGroupConfig``).
"""

from ..plugins.placement import NodeInfo

__all__ = ["NodeInfo"]
