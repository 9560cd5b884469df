"""RLinf's ``rlinf.scheduler.manager.worker_manager`` path: ``WorkerAddress`` and ``WorkerInfo``.

Both are the very classes ``rlinf.scheduler`` exports (``base.address``, ``base.info``).  RLinf's
``WorkerManager`` actor, which registers every worker, has no counterpart: the launcher's group
registry holds each group's ``WorkerInfo`` records (``WorkerGroup.worker_info_list``).
"""

from ..base.address import WorkerAddress
from ..base.info import WorkerInfo

__all__ = ["WorkerAddress", "WorkerInfo"]
