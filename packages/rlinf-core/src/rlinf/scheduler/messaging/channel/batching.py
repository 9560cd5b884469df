"""Asynchronous puts sent together (a part of ``client.ChannelClient``).

An asynchronous put to a host without maxsize is a one-way ``push`` (see
``sending``).  One that follows another push of this connection within
``BATCH_GAP`` seconds, a burst, joins a *batch* instead of going at once: a
batch is one message to the host, which appends its items in order, as it
would the same pushes one by one.  A stream of small items then costs the
host one message read per batch instead of one per item, and its producer
one send.  A put that comes alone still goes at once, so batching adds no
wait to a put that is not part of a burst.

A batch goes when it holds ``BATCH_ITEMS`` items or ``BATCH_BYTES`` bytes (in
the thread that filled it), when the work of one of its puts is waited on
(in the waiting thread), before any other message of this connection that
carries a put or a request (so every put and request of a thread keeps its
order), and otherwise from a thread of its own, as soon as it runs.  The
works of a batch's puts are done once the whole batch has been handed to the
connection: a put whose work is done happened, as a push does.  A batch
that could not be sent fails all its works, and none of its items is
delivered (a message broken midway is not applied, and gives the connection
up); the connection's failure fails a batch not yet sent.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from typing import Optional

from ...base.errors import CommTimeoutError, PeerDiedError
from .protocol import SendTimeout

#: a push that follows the last one by less than this (seconds) joins a batch
BATCH_GAP = 200e-6
#: a batch goes once it holds this many items ...
BATCH_ITEMS = 64
#: ... or this many bytes
BATCH_BYTES = 1 << 18


class _Batch:
    __slots__ = ("runs", "frames", "count", "nbytes", "future")

    def __init__(self):
        self.runs: list = []  # [key, weight, [frames of each item]]: consecutive items of one key and weight
        self.frames: list = []
        self.count = 0
        self.nbytes = 0
        self.future: concurrent.futures.Future = concurrent.futures.Future()

    def add(self, key: str, weight: float, frames, nbytes: int) -> None:
        run = self.runs[-1] if self.runs else None
        if run is None or run[0] != key or run[1] != weight:
            run = [key, weight, []]
            self.runs.append(run)
        run[2].append(len(frames))
        self.frames.extend(frames)
        self.count += 1
        self.nbytes += nbytes


class _Batches:
    """The batching side of ``ChannelClient`` (uses its sends and failure handling)."""

    def _init_batches(self) -> None:
        self._batch: Optional[_Batch] = None  # the batch filling now
        self._batch_lock = threading.Lock()  # guards _batch
        #: held from taking a batch until it has been sent: a message that must follow it waits for it
        self._flush_lock = threading.Lock()
        self._last_push = 0.0
        self._flusher: Optional[threading.Thread] = None
        self._flush_wake = threading.Event()

    def push_async(self, ctrl: dict, frames, nbytes: int, send_timeout: Optional[float] = None
                   ) -> Optional[concurrent.futures.Future]:
        """An asynchronous put to a host without maxsize: None if it was pushed now (it happened), else the
        future of the batch it joined (done once the batch was sent)."""
        now = time.monotonic()
        with self._batch_lock:
            batch = self._batch
            if batch is None and (now - self._last_push >= BATCH_GAP and not self._flush_lock.locked()):
                self._last_push = now
            else:
                if self._dead is not None:
                    raise PeerDiedError(self._dead, peer=self.host)
                start = batch is None
                if start:
                    batch = self._batch = _Batch()
                batch.add(ctrl["key"], ctrl["weight"], frames, nbytes)
                self._last_push = now
                full = batch.count >= BATCH_ITEMS or batch.nbytes >= BATCH_BYTES
                if not full:
                    if start:
                        self._wake_flusher()
                    return batch.future
        if batch is None:
            self.push(ctrl, frames, send_timeout)
            return None
        self.flush_batch(send_timeout)  # full: sent by the thread that filled it
        return batch.future

    def _wake_flusher(self) -> None:
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._flush_batches, name=f"rlinf-channel-{self.channel}-batches",
                                             daemon=True)
            self._flusher.start()
        self._flush_wake.set()

    def _flush_batches(self) -> None:
        while self._dead is None:
            if not self._flush_wake.wait(1.0):  # bounded: ends soon after the connection does
                continue
            self._flush_wake.clear()
            try:
                self.flush_batch()
            except Exception:  # held past the send timeout by another batch: it is sent after that one
                self._flush_wake.set()
        self._fail_batch(self._dead or "closed")

    def flush_batch(self, limit: Optional[float] = None) -> None:
        """Send the batch filling now, and wait for one being sent (bounded by ``limit``, the send timeout by
        default); before any message that must follow it.  A batch that cannot be sent fails its works (this
        does not raise for it); ``SendTimeout`` if another thread's batch held the connection past ``limit``."""
        if self._batch is None and not self._flush_lock.locked():
            return
        limit = self._send_timeout if limit is None else limit
        if not self._flush_lock.acquire(timeout=limit):
            raise SendTimeout(f"another send held the connection for {limit:g} s", busy=True)
        try:
            with self._batch_lock:
                batch, self._batch = self._batch, None
            if batch is None:
                return
            ctrl = {"id": 0, "op": "push", "runs": batch.runs}
            try:
                self._send_batch(ctrl, batch.frames, limit)
            except SendTimeout as exc:  # nothing of it was sent
                batch.future.set_exception(CommTimeoutError(
                    f"{batch.count} asynchronous put(s) on channel {self.channel!r}: {exc}; they were not delivered",
                    peer=self.host))
                return
            except BaseException as exc:  # the connection was given up (PeerDiedError), or interrupted
                batch.future.set_exception(exc)
                if not isinstance(exc, Exception):
                    raise
                return
            batch.future.set_result(None)
        finally:
            self._flush_lock.release()

    def _fail_batch(self, reason: str) -> None:
        with self._batch_lock:
            batch, self._batch = self._batch, None
        if batch is not None and not batch.future.done():
            batch.future.set_exception(PeerDiedError(reason, peer=self.host))

    def withdraw_batch(self, future: concurrent.futures.Future, error: Exception) -> bool:
        """Fail the batch of ``future`` with ``error`` if it is still filling (none of its items will be
        delivered); False if it was taken to be sent (its send decides)."""
        with self._batch_lock:
            batch = self._batch
            if batch is None or batch.future is not future:
                return False
            self._batch = None
        batch.future.set_exception(error)
        return True
