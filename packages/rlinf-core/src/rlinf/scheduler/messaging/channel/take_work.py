"""The ``AsyncWork`` of a channel get, hosted or local: its items leave the channel only when taken.

``wait``, ``await`` and ``then`` take the result: ``finish(reply)`` runs once
(a hosted get decodes and acknowledges its items there) and its value is
kept.  A work dropped before that runs ``untaken()``: the items it was served
go back to the head of their queue, or the get is withdrawn.
"""

from __future__ import annotations

import concurrent.futures
import threading
import weakref
from typing import Any, Callable, Optional

from ...transports.async_work import AsyncWork


class TakeWork(AsyncWork):
    """See the module docstring.  ``untaken`` must not refer to the work (it runs once the work is gone);
    ``_taken[0]`` may be set early by a subclass whose reply leaves nothing to give back."""

    def __init__(self, future: concurrent.futures.Future, what: str, finish: Callable[[Any], Any],
                 untaken: Callable[[], None]):
        super().__init__(future, what)
        self._finish, self._value = finish, None
        self._taken = [False]
        self._lock = threading.Lock()
        weakref.finalize(self, _when_dropped, untaken, self._taken)

    def _take(self, reply):
        with self._lock:
            if self._value is None:
                self._taken[0] = True
                self._value = (self._finish(reply),)
            return self._value[0]

    def wait(self, timeout: Optional[float] = None) -> Any:
        # timeout=None waits as long as the user asked; a hosted get's host answers or is declared dead by heartbeat
        return self._take(super().wait(timeout))

    async def async_wait(self) -> Any:
        return self._take(await super().async_wait())

    def then(self, fn: Callable[[Any], Any]) -> AsyncWork:
        return super().then(lambda reply: fn(self._take(reply)))


def _when_dropped(untaken: Callable[[], None], taken: list) -> None:
    if not taken[0]:
        taken[0] = True
        untaken()
