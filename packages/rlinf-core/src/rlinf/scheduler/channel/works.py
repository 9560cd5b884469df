"""The ``AsyncWork`` kinds a hosted channel's asynchronous operations return.

``_TakeWork`` (a get): its item leaves the channel only once the user takes
it.  ``_PutWork`` (a put): a ``wait`` that times out withdraws the put, so a
put whose caller got an error is never delivered.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Optional

from ..base.errors import CommTimeoutError
from ..messaging.channel.client import ChannelClient
from ..messaging.channel.protocol import SendTimeout
from ..messaging.channel.take_work import TakeWork
from ..transports.async_work import AsyncWork


class _TakeWork(TakeWork):
    """The AsyncWork of a hosted get: ``wait``/``await``/``then`` take its item (and acknowledge it to the
    host); if the work is dropped before that, the request is cancelled and the host puts the item
    back at the head of its queue."""

    def __init__(self, raw: concurrent.futures.Future, what: str, finish, client: ChannelClient, rid: int):
        out: concurrent.futures.Future = concurrent.futures.Future()
        super().__init__(out, what, finish, lambda: client.abandon(rid))
        taken = self._taken

        def arrived(f: concurrent.futures.Future) -> None:
            exc = f.exception()
            if exc is not None:
                taken[0] = True  # nothing to put back
                out.set_exception(exc)
                return
            ctrl_back, items = f.result()  # done: this is its done-callback
            if "count" not in ctrl_back:
                taken[0] = True
            # decoded only once the user takes it: finish() also acknowledges the item
            out.set_result((ctrl_back, items))

        raw.add_done_callback(arrived)


class _PutWork(AsyncWork):
    """The AsyncWork of an asynchronous put: done once the item is queued.

    A ``wait(timeout)`` that runs out withdraws the put (the host drops it;
    the work fails with ``CommTimeoutError`` from then on), unless a reader
    has already claimed it to commit it: the commit's outcome, which comes
    within ``ChannelClient.settle_limit`` seconds, is then the wait's.
    """

    def __init__(self, raw: concurrent.futures.Future, what: str, finish, client: ChannelClient):
        out: concurrent.futures.Future = concurrent.futures.Future()

        def chain(f: concurrent.futures.Future) -> None:
            try:
                out.set_result(finish(f.result()))  # done: this is its done-callback
            except BaseException as exc:
                out.set_exception(exc)

        super().__init__(out, what)
        self._raw, self._client, self._finish = raw, client, finish
        raw.add_done_callback(chain)

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Wait for the put; see the class docstring.

        Raises ``CommTimeoutError`` once withdrawn (its timeout ran out
        before the host took the item), or the put's own error."""
        try:
            return super().wait(timeout)
        except TimeoutError:
            if self._future.done():
                raise  # the put's own error (a CommTimeoutError is one too)
        self._client.withdraw(self._raw, CommTimeoutError(
            f"{self._describe} not finished after {timeout} s; it was withdrawn (it will not be delivered)",
            peer=self._client.host))
        try:
            return super().wait(self._client.settle_limit)  # bounded: withdrawn above, or its commit decides
        except TimeoutError:
            outcome = self._raw.outcome  # its commit decided, its hand-over held up behind slow callbacks
            if self._future.done() or outcome is None or outcome[1] is not None:
                raise
            return self._finish(outcome[0])


class _BatchedPutWork(AsyncWork):
    """The AsyncWork of an asynchronous put sent with the others of its burst (see ``batching``): done once
    its batch was sent.  ``wait`` sends the batch if it has not gone yet; a ``wait(timeout)`` that runs out
    while it still has not (another thread's send held the connection) withdraws the whole batch, whose
    puts then fail with ``CommTimeoutError`` and are never delivered."""

    def __init__(self, batch: concurrent.futures.Future, what: str, client: ChannelClient):
        super().__init__(batch, what)
        self._client = client

    def wait(self, timeout: Optional[float] = None) -> Any:
        client = self._client
        if not self._future.done():
            try:
                client.flush_batch(timeout, final=False)
            except SendTimeout:
                client.withdraw_batch(self._future, CommTimeoutError(
                    f"{self._describe} not sent after {timeout} s; it was withdrawn with its batch "
                    f"(none of them will be delivered)", peer=client.host))
        try:
            return super().wait(timeout)
        except TimeoutError:
            if self._future.done():
                raise
        # taken by another thread's send, which settles it when it ends (by its own deadline, or when the
        # connection fails): its outcome is this wait's (bounded)
        return super().wait(5 * client.settle_limit)
