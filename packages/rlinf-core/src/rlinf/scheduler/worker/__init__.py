"""``rlinf.scheduler.worker``: the ``Worker`` base class and its group, at RLinf's import paths.

RLinf programs import ``rlinf.scheduler.worker.worker.Worker`` and
``rlinf.scheduler.worker.worker_group.WorkerGroup``; both are the very objects
``rlinf.scheduler`` exports.
"""

from ..base.address import WorkerAddress
from ..base.info import WorkerInfo
from .worker import Worker
from .worker_group import WorkerGroup, WorkerGroupFuncResult

__all__ = ["Worker", "WorkerAddress", "WorkerGroup", "WorkerGroupFuncResult", "WorkerInfo"]
