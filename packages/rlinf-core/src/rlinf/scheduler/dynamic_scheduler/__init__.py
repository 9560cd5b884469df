"""RLinf's ``rlinf.scheduler.dynamic_scheduler`` module paths.

RLinf's dynamic scheduler resizes the rollout, inference and actor components
of its math-reasoning pipeline while it trains.  It is RLinf application
logic, not scheduler API: it drives RLinf's Megatron actor and SGLang/vLLM
rollout workers and reads RLinf's data records (``rlinf.data.io_struct``) and
placement (``rlinf.utils.placement``).  Here the module paths exist so that
RLinf modules importing them import:

* ``utils``: the scheduler-level helpers, as in RLinf: the channel and queue
  names (``get_scheduler_channel``, ``get_scheduler_request_queue``,
  ``get_scheduler_response_queue``), ``get_valid_dp_sizes``, the report and
  action records, and the global scheduler state.
* ``manager`` (``RolloutScalingScheduler``, the component managers) and
  ``scheduler_worker`` (``SchedulerWorker``): importable; using one raises
  ``NotImplementedError`` naming what it needs (RLinf's own package).

Layer: beside ``tools``, above the channel API (``SchedulerWorker`` is a ``Worker``).
"""

from .utils import get_scheduler_channel, get_scheduler_request_queue, get_scheduler_response_queue, get_valid_dp_sizes

__all__ = ["get_scheduler_channel", "get_scheduler_request_queue", "get_scheduler_response_queue",
           "get_valid_dp_sizes"]
