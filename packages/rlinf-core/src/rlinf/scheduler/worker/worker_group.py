"""RLinf's path to ``WorkerGroup``; the implementation lives in ``rlinf.scheduler.group``."""

from ..group import WorkerGroup, WorkerGroupFuncResult

__all__ = ["WorkerGroup", "WorkerGroupFuncResult"]
