"""``WorkerGroupFuncResult``: the pending result of one group call, and which failure it reports.

``WorkerGroup`` (``runtime.group``) makes one per call; ``wait()`` gathers each rank's outcome through
the launcher session the call went to and turns deaths, rejections and exceptions into the one error
that names the cause.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional

from ..base import config
from ..base.errors import WorkerDiedError, WorkerError
from ..base.hooks import hook
from ..base.timing import reduce_durations
from ..plugins import watch
from ..plugins.launcher import CallOutcome, Died, LauncherSession, Rejected

if TYPE_CHECKING:
    from .group import WorkerGroup

__all__ = ["WorkerGroupFuncResult"]


def _primary_error(errors: list[WorkerError]) -> WorkerError:
    """The failure to report when several ranks failed: the cause, not the echo.

    A dead process beats an exception, an exception beats a failure caused by
    a peer (a peer died, a message never came); ties go to the earliest.
    """

    def rank(err):
        kind = 0 if isinstance(err, WorkerDiedError) else (2 if getattr(err, "secondary", False) else 1)
        return (kind, err.timestamp)

    return min(errors, key=rank)


class WorkerGroupFuncResult:
    """The pending result of one group call (``group.method(...)`` returns it).

    ``wait()`` (or ``await``) gives the results in rank order.

    Args:
        group: the group called.
        method: the method's name.
        ranks: the ranks that run the call.
        calls: the launcher's pending calls, one per rank.
        session: the launcher session the calls went to.
    """

    def __init__(self, group: "WorkerGroup", method: str, ranks: list[int], calls: list, session: LauncherSession):
        self._group = group
        self._session = session  # the one the calls went to: the group may be stopped before they are waited for
        self._method = method
        self._ranks = ranks
        self._calls = calls
        self._submitted = time.monotonic()  # for the stuck-call report (``watch``)
        self._outcomes: Optional[list] = None
        self._durations: Optional[list[dict]] = None

    @property
    def ranks(self) -> list[int]:
        """The ranks that run this call, in the order of the results."""
        return list(self._ranks)

    def done(self) -> bool:
        """Whether every rank has finished the call (without waiting)."""
        return self._outcomes is not None or all(c.done() for c in self._calls)

    @hook("group_result")
    def _finish(self, outcomes: list) -> list:
        self._outcomes = outcomes
        if self._durations is None:
            self._durations = [o.durations if type(o) is CallOutcome else {} for o in outcomes]
        return self._results()

    def _results(self) -> list:
        errors = []
        for rank, outcome in zip(self._ranks, self._outcomes):
            if isinstance(outcome, Died):
                errors.append(self._group._died(rank, self._method, outcome.reason, self._submitted))
            elif isinstance(outcome, Rejected):
                errors.append(self._group._rejected(rank, self._method, outcome))
            elif not outcome.ok:
                errors.append(outcome.value)
        if errors:
            primary = _primary_error(errors)
            primary.errors = errors
            cause = getattr(primary, "cause", None)
            if cause is not None:
                raise primary from cause
            raise primary
        return [o.value for o in self._outcomes]

    def wait(self, timeout: Optional[float] = None) -> list:
        """Results in rank order, once every rank finished.

        Args:
            timeout: seconds to wait; ``None``: until the calls end (a dead worker ends its call).

        Raises:
            WorkerMethodError: a rank's method raised (the primary failure; ``errors`` lists every rank's).
            WorkerDiedError: a rank's worker process died during the call.
            TimeoutError: the calls did not finish within ``timeout``.
        """
        timeout = config.check_timeout(timeout)
        if self._outcomes is not None:
            return self._results()
        watched = watch.watching(self)
        try:
            outcomes = self._session.collect(self._calls, timeout)
        except TimeoutError:
            pending = [r for r, c in zip(self._ranks, self._calls) if not c.done()]
            raise TimeoutError(
                f"method {self._method!r} on group {self._group._name!r} did not finish within "
                f"{timeout} s; ranks still running: {pending}"
            ) from None
        finally:
            watch.done(watched)
        return self._finish(outcomes)

    async def async_wait(self) -> list:
        """Awaitable ``wait`` that never blocks the event loop."""
        if self._outcomes is None:
            watched = watch.watching(self)
            try:
                outcomes = await self._session.collect_async(self._calls)
            finally:
                watch.done(watched)
            if self._outcomes is None:
                self._finish(outcomes)
        return self._results()

    def __await__(self):
        return self.async_wait().__await__()

    def consume_duration(self, reduction_type: str = "max"):
        """RLinf's name for ``consume_durations(reduction_type)``.

        Args:
            reduction_type: ``"max"``, ``"min"`` or ``"mean"`` over the ranks.

        Raises:
            ValueError: an unknown ``reduction_type``.
        """
        return self.consume_durations(reduction_type)

    def consume_durations(self, reduction_type: str = "max", return_per_rank: bool = False):
        """Timings of this call, ``{tag: seconds}`` reduced over the ranks that ran it.

        Waits for the call first; consumed once: a second call returns ``{}``.

        Args:
            reduction_type: ``"max"``, ``"min"`` or ``"mean"`` over the ranks.
            return_per_rank: return ``(reduced, [per-rank dict, ...])`` instead.

        Raises:
            ValueError: an unknown ``reduction_type``.
        """
        if reduction_type not in ("max", "min", "mean"):
            raise ValueError(f"reduction_type must be 'max', 'min' or 'mean', got {reduction_type!r}")
        if self._outcomes is None:
            try:
                self.wait()  # as long as the user's method runs (like wait() itself); worker deaths end it
            except WorkerError:
                pass  # the timings of the ranks that ran are still reported
        per_rank = self._durations or []
        self._durations = [{} for _ in per_rank]
        reduced = reduce_durations(per_rank, reduction_type)
        return (reduced, per_rank) if return_per_rank else reduced
