"""``AsyncRouteWork``: one handle on the shards of a routed send or receive (RLinf's class, same path).

``Worker.send_to`` and ``Worker.recv_from`` with ``async_op=True`` start one
channel or point-to-point operation per shard of their route plan and return
one ``AsyncRouteWork`` over them.  Waiting on it waits on every shard's work,
in plan order, then runs the finishing function once on their results (a
receive validates and merges the shards there; a send has nothing to finish).

The finishing function runs in the thread (or event loop) that waits, never in
a communication thread: a receive's finish records routes in the worker's
``batch_router``, which the worker's own code reads.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Any, Callable, Optional, Sequence

from ..base import config
from ..transports.async_work import AsyncWork

__all__ = ["AsyncRouteWork", "AsyncWork"]


class AsyncRouteWork(AsyncWork):
    """The works of a routed exchange's shards, finished into one result.

    ``wait()``, ``await work`` and ``await work.async_wait()`` return the
    finished result; ``done()`` tells whether every shard's work has completed.
    The result (or the error the finish raised) is kept: later waits return it
    again without running the finish twice.

    Args:
        works: the shards' works (anything with ``wait``, ``async_wait`` and ``done``), in plan order.
        finalize_fn: called once with the list of the works' results; its return value is the result.

    Example:
        ```python
        work = self.recv_from("env", channel, tag="obs", batch_size=8, async_op=True)
        obs = work.wait()           # or: obs = await work
        ```
    """

    def __init__(self, works: Sequence[Any], finalize_fn: Callable[[list], Any]):
        super().__init__(concurrent.futures.Future(), f"routed exchange of {len(works)} shard(s)")
        self._works = list(works)
        self._finalize_fn = finalize_fn
        self._lock = threading.Lock()

    def _settle(self, results: list) -> Any:
        """Run the finish once (under the lock) and keep its outcome; return it or raise its error."""
        with self._lock:
            if not self._future.done():
                try:
                    self._future.set_result(self._finalize_fn(results))
                except BaseException as exc:  # kept, so that a second wait does not finish twice
                    self._future.set_exception(exc)
        return self._future.result()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Wait for every shard's work, then return the finished result.

        Args:
            timeout: seconds for all shards together; ``None``: each shard's work
                is bounded by its own operation's timeout (the routed call's
                ``timeout``, by default the configured ``RLINF_TIMEOUT``).

        Returns:
            What the finishing function returned: the merged payload of a receive,
            ``None`` for a send.

        Raises:
            TimeoutError: ``timeout`` ran out before every shard's work completed.
            Exception: a shard's error (``CommTimeoutError``, ``PeerDiedError``, ...),
                or the finish's (a wrong batch size is a ``ValueError``).
        """
        if self._future.done():
            return self._future.result()
        timeout = config.check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        results = []
        for work in self._works:
            if deadline is None:
                results.append(work.wait())  # wait(None) as asked: each work is bounded by its own operation's timeout
                continue
            left = deadline - time.monotonic()
            if left <= 0 and not work.done():
                raise TimeoutError(f"{self._describe} not finished after {timeout} s")
            results.append(work.wait(max(left, 1e-3)))
        return self._settle(results)

    async def async_wait(self) -> Any:
        """Await every shard's work without blocking the event loop, then return the finished result."""
        if self._future.done():
            return self._future.result()
        results = [await work.async_wait() for work in self._works]
        return self._settle(results)

    def __await__(self):
        return self.async_wait().__await__()

    def done(self) -> bool:
        """Whether every shard's work has completed (the finish may not have run yet)."""
        return self._future.done() or all(work.done() for work in self._works)

    def then(self, fn: Callable, *args, **kwargs):
        """Not supported, as in RLinf: the finish must run where the result is waited for.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("AsyncRouteWork does not support chained callbacks.")

    def get_next_work(self) -> None:
        """RLinf's chaining hook: an ``AsyncRouteWork`` has no next work."""
        return None
