"""RLinf's path to ``WorkerGroup``; the implementation lives in ``rlinf.scheduler.runtime.group``."""

from ..runtime.group import WorkerGroup, WorkerGroupFuncResult

__all__ = ["WorkerGroup", "WorkerGroupFuncResult"]
