"""``AsyncWork``: the handle an ``async_op=True`` operation returns."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Optional

from ..base import config


class AsyncWork:
    """A pending communication; ``wait()`` returns its result (the object, for a recv)."""

    def __init__(self, future: concurrent.futures.Future, describe: str = "operation"):
        self._future = future
        self._describe = describe

    @classmethod
    def completed(cls, value: Any = None, describe: str = "operation") -> "AsyncWork":
        fut: concurrent.futures.Future = concurrent.futures.Future()
        fut.set_result(value)
        return cls(fut, describe)

    @classmethod
    def gather(cls, works: list, value: Any = None, describe: str = "operation") -> "AsyncWork":
        """One AsyncWork that finishes, with ``value``, when all of ``works`` have (or fails with the first error)."""
        if not works:
            return cls.completed(value, describe)
        out: concurrent.futures.Future = concurrent.futures.Future()
        state = {"remaining": len(works), "settled": False}
        # the callbacks run concurrently on whichever threads finish the works: the
        # count and the decision to settle ``out`` change under one lock (a lost
        # decrement would leave ``out`` pending forever); ``out`` is settled outside
        # it, because settling runs ``out``'s own callbacks
        lock = threading.Lock()

        def one_done(fut: concurrent.futures.Future) -> None:
            exc = fut.exception()
            with lock:
                state["remaining"] -= 1
                if state["settled"] or (exc is None and state["remaining"] > 0):
                    return
                state["settled"] = True
            if exc is not None:
                out.set_exception(exc)
            else:
                out.set_result(value)

        for w in works:
            w._future.add_done_callback(one_done)
        return cls(out, describe)

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until done and return the result; re-raises the operation's error.

        ``timeout``: seconds to wait (``None``: until done).  Raises ``TimeoutError`` if the operation
        has not finished by then; the operation goes on unless its own kind
        says otherwise (a channel put's work withdraws the put and raises
        ``CommTimeoutError``)."""
        timeout = config.check_timeout(timeout)
        try:
            return self._future.result(timeout)
        except concurrent.futures.TimeoutError:  # the builtin TimeoutError since Python 3.11
            if self._future.done():  # the operation's own (a CommTimeoutError names its peer), or just done
                return self._future.result()
            raise TimeoutError(f"{self._describe} not finished after {timeout} s") from None

    async def async_wait(self) -> Any:
        """Await completion without blocking the event loop."""
        return await asyncio.wrap_future(self._future)

    def __await__(self):
        return self.async_wait().__await__()

    def done(self) -> bool:
        return self._future.done()

    def then(self, fn: Callable[[Any], Any]) -> "AsyncWork":
        """A new AsyncWork whose result is ``fn(result)`` once this one finishes."""
        nxt: concurrent.futures.Future = concurrent.futures.Future()

        def chain(fut: concurrent.futures.Future) -> None:
            try:
                nxt.set_result(fn(fut.result()))
            except BaseException as exc:
                nxt.set_exception(exc)

        self._future.add_done_callback(chain)
        return AsyncWork(nxt, self._describe)
