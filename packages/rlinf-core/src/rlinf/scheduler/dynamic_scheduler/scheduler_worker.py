"""RLinf's ``dynamic_scheduler.scheduler_worker`` path: ``SchedulerWorker`` (not provided, see ``manager``)."""

from __future__ import annotations

from ..worker import Worker
from .manager import NEEDS


class SchedulerWorker(Worker):
    """RLinf's dynamic scheduler worker; building one raises ``NotImplementedError`` saying what it needs."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError(f"SchedulerWorker: {NEEDS}")


__all__ = ["SchedulerWorker"]
