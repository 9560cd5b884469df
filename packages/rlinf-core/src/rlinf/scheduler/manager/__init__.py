"""RLinf's ``rlinf.scheduler.manager`` path: ``Tracer`` (see ``manager.tracer``), and ``WorkerAddress`` /
``WorkerInfo`` (``manager.worker_manager``).

Layer: the public API; it may import ``tracing`` and the layers below.
"""

from .tracer import Tracer
from .worker_manager import WorkerAddress, WorkerInfo

__all__ = ["Tracer", "WorkerAddress", "WorkerInfo"]
