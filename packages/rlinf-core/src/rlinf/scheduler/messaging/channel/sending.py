"""How a channel client sends (a part of ``client.ChannelClient``).

Every message to the host goes through ``_send``, which bounds its wait for
the connection (another thread's send included) by a deadline.  A request
(``request``) gets a reply, routed to its future by whichever thread reads;
a ``push`` is a put to a host that always has room, which needs no reply;
one-way messages (cancels, acks, returns, ``more``) go through
``_send_one_way``, which never loses one: what cannot go now is queued for
the next message or heartbeat tick.  Queued acknowledgements ride on any
request or push (``_send_with_acks``).  A send broken midway gives the
connection up, since the stream would be unusable.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Optional

from ...base.errors import PeerDiedError
from ...plugins.transport import LinkBusy
from .commits import _Reply
from .protocol import SendTimeout, pack, send_limit


class _Sends:
    """The sending side of ``ChannelClient`` (uses its link, futures, locks and failure handling)."""

    def request(self, ctrl: dict, frames=(), send_timeout: Optional[float] = None,
                blocking: bool = False) -> tuple[int, concurrent.futures.Future]:
        """Send a request; raises ``SendTimeout`` if it could not start within ``send_timeout`` s.

        ``blocking``: the caller goes on to ``wait_reply``, which reads the
        reply itself if no one reads, so the background reader is not woken
        for it (it still reads it if it is awake for something else).  The
        future must then get no callbacks: whichever thread reads sets it."""
        limit = send_limit(self._send_timeout, frames) if send_timeout is None else send_timeout
        if ctrl.get("op") == "put":
            counted = [0]
            try:
                self.hosted(ctrl["key"], lambda: self._end_route_of(ctrl["key"]), counted)  # its route ends first
                return self._request(ctrl, frames, limit, blocking)
            finally:
                self.hosted_done(ctrl["key"], counted)
        return self._request(ctrl, frames, limit, blocking)

    def _request(self, ctrl: dict, frames, limit: float, blocking: bool) -> tuple[int, concurrent.futures.Future]:
        self._before_send(limit)
        fut = _Reply()
        fut.owner = threading.get_ident()
        with self._lock:
            if self._dead:
                raise PeerDiedError(self._dead, peer=self.host)
            rid = fut.rid = next(self._ids)
            if ctrl.get("op") == "put":
                fut.put_id = rid
                self._open_puts.add(rid)
            self._pending[rid] = fut
            if blocking:
                self._blocking.add(rid)
        ctrl["id"] = rid
        self._send_with_acks(ctrl, frames, limit, lambda: self._forget(rid))
        if not blocking:
            self._nudge()
        return rid, fut

    def _send_failed(self, exc: BaseException, acks: Optional[list], limit: float) -> None:
        """Raise for a request whose send failed: ``SendTimeout`` if nothing of it was sent (its ``acks``
        ride on the next message), else the connection is given up (a message broken midway leaves the
        stream unusable) and ``PeerDiedError``, or the interrupt, is raised."""
        if not isinstance(exc, Exception):  # interrupted: part of the message, or all of it, may have gone
            self.fail(f"{self._connection()} was given up: {type(exc).__name__} interrupted a send on it")
            raise exc
        if isinstance(exc, TimeoutError) and self._link.is_open():
            if acks:
                self._acks.extendleft(reversed(acks))  # not sent: they ride on the next message
            if isinstance(exc, LinkBusy):
                raise SendTimeout(f"another send on the connection held it for {limit:g} s", busy=True) from None
            raise SendTimeout(f"the transport took no part of the request within {limit:g} s") from None
        reason = f"cannot reach the host of channel {self.channel!r} ({self.host}): {type(exc).__name__}: {exc}"
        self.fail(reason)
        raise PeerDiedError(reason, peer=self.host) from None

    def push(self, ctrl: dict, frames, send_timeout: Optional[float] = None) -> None:
        """Send a put to a host that always has room (``unbounded``), as a ``push`` it appends as it
        reads it: no reply, no commit.  Returns once the message was handed whole to the connection, so
        the put happened (the host applies the whole messages a departed client left); raises as
        ``request`` does if it was not (``SendTimeout``: nothing was sent)."""
        limit = send_limit(self._send_timeout, frames) if send_timeout is None else send_timeout
        counted = [0]
        try:
            if self.hosted(ctrl["key"], lambda: self.put_direct(ctrl, frames, limit, counted), counted):
                return  # went straight to the consumer (see ``direct_out``)
            self._push(ctrl, frames, limit)
        finally:
            self.hosted_done(ctrl["key"], counted)

    def _push(self, ctrl: dict, frames, limit: float) -> None:
        self._before_send(limit)
        self._pushed = True  # (the heartbeat tick reads: a route may be offered, see ``direct_out``)
        if self._dead:
            raise PeerDiedError(self._dead, peer=self.host)
        if self._acks:
            ctrl["op"] = "push"
            ctrl.pop("timeout", None)
            return self._send_with_acks(ctrl, frames, limit)
        head = self._push_heads.get((ctrl["key"], ctrl["weight"]))  # a push's control is the same for its key
        if head is None:
            if len(self._push_heads) >= 1024:
                self._push_heads.clear()
            head = self._push_heads[ctrl["key"], ctrl["weight"]] = pack({"op": "push", "key": ctrl["key"],
                                                                         "weight": ctrl["weight"]})
        try:
            self._send([head, *frames], limit)
        except BaseException as exc:
            self._send_failed(exc, None, limit)

    def _before_send(self, limit: float, batch: bool = True) -> None:
        """What goes before a put or a request: a batch of asynchronous puts (see ``batching``), the
        cancels of abandoned requests (an item put back keeps its place ahead of this message), and fed
        items given back; ``SendTimeout`` if they could not go within ``limit``."""
        if batch and (self._batch is not None or self._flushing):
            self.flush_batch(limit, final=False)  # one that cannot go within this message's limit stays queued
        self._send_abandoned(limit)
        if self._ending and not self._end_routes_out(limit):  # direct routes that end go before this message
            raise SendTimeout(f"another send held the connection for {limit:g} s", busy=True)
        if self._returns and not self._send_returns(limit):  # fed items given back go before this message
            raise SendTimeout(f"another send held the connection for {limit:g} s", busy=True)

    def _send_batch(self, ctrl: dict, frames, limit: float) -> None:
        """Send a batch of pushes (``flush_batch`` holds its lock); raises as ``push`` does."""
        self._before_send(limit, batch=False)
        self._pushed = True
        if self._dead:
            raise PeerDiedError(self._dead, peer=self.host)
        self._send_with_acks(ctrl, frames, limit)

    def _send_with_acks(self, ctrl: dict, frames, limit: float, undo=None) -> None:
        """Send a message with the queued acks riding on it; if it fails, ``undo()``, then raise (``_send_failed``)."""
        acks = self._take_acks() if self._acks else None
        if acks:
            ctrl["acks"] = acks
        try:
            self._send([pack(ctrl), *frames], limit)
        except BaseException as exc:
            if undo is not None:
                undo()
            self._send_failed(exc, acks, limit)

    def _send_abandoned(self, limit: Optional[float] = None, when_idle: bool = False) -> None:
        """Send the cancels of requests given up by garbage collection (or not sent before); stops at
        the first that cannot go now (it is queued again)."""
        for _ in range(len(self._abandoned)):
            try:
                rid = self._abandoned.popleft()
            except IndexError:  # another thread took the last one
                return
            if not self.cancel(rid, limit, when_idle):
                return

    def _send(self, frames: list, limit: float) -> None:
        me = threading.get_ident()
        self._sending.add(me)
        self._acked_quietly = False  # the host reads the ack link before this message
        try:
            self._link.send(frames, time.monotonic() + limit)
        finally:
            self._sending.discard(me)

    def _send_one_way(self, ctrl: dict, limit: Optional[float] = None, when_idle: bool = False, frames=()) -> bool:
        """Send a message that gets no reply; False if nothing of it was sent because another
        thread's send held the link for ``limit`` s (the send timeout by default), or, with
        ``when_idle``, because another send was under way."""
        if self._dead:
            return True  # nothing to send it on; fail() has failed what waited
        if when_idle and self._sending:
            return False
        try:
            self._send([pack(ctrl), *frames], self._send_timeout if limit is None else limit)
            return True
        except Exception as exc:
            if isinstance(exc, TimeoutError) and self._link.is_open():
                return False
            self.fail(f"cannot reach the host of channel {self.channel!r} ({self.host}): {type(exc).__name__}: {exc}")
            return True
