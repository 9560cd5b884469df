"""``rlinf.scheduler.collective``: RLinf's import paths for collective options and async works.

``CollectiveGroupOptions`` is defined in ``rlinf.scheduler.plugins.options``;
``AsyncRouteWork``, the handle ``Worker.send_to``/``recv_from`` return with
``async_op=True``, in ``.async_work``; ``AsyncWork`` is the handle of every other
``async_op=True`` operation (``rlinf.scheduler.transports.async_work``).

Layer: one of the facades above ``runtime``; ``worker`` imports it.
"""

from ..plugins.options import CollectiveGroupOptions
from .async_work import AsyncRouteWork, AsyncWork

__all__ = ["AsyncRouteWork", "AsyncWork", "CollectiveGroupOptions"]
