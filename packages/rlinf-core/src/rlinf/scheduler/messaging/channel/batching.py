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
up); the connection's failure fails a batch not yet sent.  A batch that
another message must precede, but which cannot go within that message's own
limit, stays queued for the thread of its own (it fails only once its own
send, with the send timeout of its puts, did).  At exit, what is queued goes
before the interpreter ends.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import threading
import time
import weakref
from typing import Optional

from ...base.errors import CommTimeoutError, CommunicationError, PeerDiedError
from ...plugins.transport import HeldWithin, LinkBusy
from .protocol import SendTimeout, send_limit

#: a push that follows the last one by less than this (seconds) joins a batch
BATCH_GAP = 200e-6
#: a batch goes once it holds this many items ...
BATCH_ITEMS = 64
#: ... or this many bytes
BATCH_BYTES = 1 << 18
#: seconds a batch queued at exit may take to go
EXIT_LIMIT = 5.0

_batching: "weakref.WeakSet" = weakref.WeakSet()  # clients that made a batch: flushed at exit


class _Batch:
    __slots__ = ("runs", "frames", "count", "nbytes", "futures")

    def __init__(self):
        self.runs: list = []  # [key, weight, [frames of each item]]: consecutive items of one key and weight
        self.frames: list = []
        self.count = 0
        self.nbytes = 0
        #: the futures of its puts' works: one per batch merged into it (see ``_requeue``)
        self.futures: list = [concurrent.futures.Future()]

    def add(self, key: str, weight: float, frames, nbytes: int) -> None:
        self._run(key, weight).append(len(frames))
        self.frames.extend(frames)
        self.count += 1
        self.nbytes += nbytes

    def _run(self, key: str, weight: float) -> list:
        run = self.runs[-1] if self.runs else None
        if run is None or run[0] != key or run[1] != weight:
            run = [key, weight, []]
            self.runs.append(run)
        return run[2]

    def extend(self, newer: "_Batch") -> None:
        """Append the items of ``newer`` (a batch made after this one), and take on its works."""
        for key, weight, sizes in newer.runs:
            self._run(key, weight).extend(sizes)
        self.frames.extend(newer.frames)
        self.count += newer.count
        self.nbytes += newer.nbytes
        self.futures.extend(newer.futures)

    def settle(self, error: Optional[BaseException]) -> None:
        for f in self.futures:
            if f.done():
                continue
            if error is None:
                f.set_result(None)
            else:
                f.set_exception(error)


class _Batches:
    """The batching side of ``ChannelClient`` (uses its sends and failure handling)."""

    def _init_batches(self) -> None:
        self._batch: Optional[_Batch] = None  # the batch filling now
        self._batch_lock = threading.Lock()  # guards _batch
        #: held from taking a batch until it has been sent: a message that must follow it waits for it
        self._flush_lock = threading.RLock()  # an RLock for ``HeldWithin`` (never taken twice by a thread)
        self._flushing = False  # a batch is being sent (under _flush_lock)
        self._last_push = 0.0
        self._flusher: Optional[threading.Thread] = None
        self._flush_wake = threading.Event()

    def push_async(self, ctrl: dict, frames, nbytes: int, send_timeout: Optional[float] = None
                   ) -> Optional[concurrent.futures.Future]:
        """An asynchronous put to a host without maxsize: None if it was pushed now (it happened), else the
        future of the batch it joined (done once the batch was sent)."""
        limit = self._send_timeout if send_timeout is None else send_timeout
        # a put that is not part of a burst may start its key's route, once its link is open (see ``direct_out``)
        alone = self._batch is None and not self._flushing and time.monotonic() - self._last_push >= BATCH_GAP
        counted = [0]
        try:
            if self.hosted(ctrl["key"], lambda: self.put_direct(ctrl, frames, limit, counted, "open" if alone else False),
                           counted):
                return None  # went straight to the consumer
            return self._push_async(ctrl, frames, nbytes, send_timeout)  # (a batch goes before any start)
        finally:
            self.hosted_done(ctrl["key"], counted)

    def _push_async(self, ctrl: dict, frames, nbytes: int, send_timeout: Optional[float]
                    ) -> Optional[concurrent.futures.Future]:
        now = time.monotonic()
        with self._batch_lock:
            batch = self._batch
            if batch is None and now - self._last_push >= BATCH_GAP and not self._flushing:
                self._last_push = now
            else:
                if self._dead is not None:
                    raise PeerDiedError(self._dead, peer=self.host)
                start = batch is None
                if start:
                    batch = self._batch = _Batch()
                batch.add(ctrl["key"], ctrl["weight"], frames, nbytes)
                self._last_push = now
                future = batch.futures[0]
                if batch.count < BATCH_ITEMS and batch.nbytes < BATCH_BYTES:
                    if start:
                        self._wake_flusher()
                    return future
        if batch is None:  # (counted as on its way to the host by ``push_async``: it does not look for a route again)
            self._push(ctrl, frames, send_limit(self._send_timeout, frames) if send_timeout is None else send_timeout)
            return None
        try:
            self.flush_batch(send_timeout, final=False)  # full: the thread that filled it sends it
        except SendTimeout:  # the connection is held: the thread of its own sends it after that
            self._wake_flusher()
        except BaseException:  # interrupted: this put raised, so its batch is not delivered
            self.withdraw_batch(future, CommunicationError(
                f"an asynchronous put on channel {self.channel!r} was withdrawn with its batch: an interrupt "
                f"landed in the put that filled it"))
            raise
        return future

    def _wake_flusher(self) -> None:
        if self._flusher is None:
            _batching.add(self)
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
            self._read_arrived()  # a route offered for these pushes is heard now, not on the next heartbeat
            #                       tick, so the next burst can take it
        self._fail_batch(self._dead or "closed")

    def flush_batch(self, limit: Optional[float] = None, final: bool = True) -> None:
        """Send the batch filling now, and wait for one being sent (at most ``limit``, the send timeout by
        default): before any message that must follow it.

        ``SendTimeout`` if another thread's send held the connection past
        ``limit``; if its own send then took nothing within ``limit``, the
        batch fails its works (``final``), or stays queued, ahead of any
        newer one, and ``SendTimeout`` is raised.  A batch that cannot be
        sent otherwise fails its works (this does not raise for it).  Works
        are settled after the lock is released: their callbacks never run
        while a send of this connection waits on them."""
        if self._batch is None and not self._flushing:
            return
        limit = self._send_timeout if limit is None else limit
        batch, sent, requeued, error = None, False, False, None
        try:
            with HeldWithin(self._flush_lock, time.monotonic() + limit, "batch"):
                self._flushing = True
                try:
                    with self._batch_lock:
                        batch, self._batch = self._batch, None
                    if batch is None:
                        return
                    self._send_batch({"id": 0, "op": "push", "runs": batch.runs}, batch.frames, limit)
                    sent = True
                except SendTimeout as exc:  # nothing of it was sent
                    if not final:
                        self._requeue(batch)
                        requeued = True
                        raise
                    error = CommTimeoutError(f"{batch.count} asynchronous put(s) on channel {self.channel!r}: {exc}; "
                                             f"they were not delivered", peer=self.host)
                except Exception as exc:  # the connection was given up (PeerDiedError): the works carry it
                    error = exc
                finally:
                    self._flushing = False
        except LinkBusy:
            raise SendTimeout(f"another send held the connection for {limit:g} s", busy=True) from None
        finally:
            if batch is not None and not requeued:  # an interrupt anywhere above fails it: never left pending
                batch.settle(None if sent else error or CommunicationError(
                    f"{batch.count} asynchronous put(s) on channel {self.channel!r} were interrupted while sent; "
                    f"they were not delivered (the connection was given up)"))

    def _requeue(self, batch: _Batch) -> None:
        """Put a batch that could not go back, ahead of the puts that came since."""
        with self._batch_lock:
            newer, self._batch = self._batch, batch
            if newer is not None:
                batch.extend(newer)
        self._flush_wake.set()

    def _fail_batch(self, reason: str) -> None:
        with self._batch_lock:
            batch, self._batch = self._batch, None
        if batch is not None:
            batch.settle(PeerDiedError(reason, peer=self.host))

    def withdraw_batch(self, future: concurrent.futures.Future, error: Exception) -> bool:
        """Fail the batch of ``future`` with ``error`` if it has not been taken to be sent (none of its
        items will be delivered); False if it was (its send decides)."""
        with self._batch_lock:
            batch = self._batch
            if batch is None or future not in batch.futures:
                return False
            self._batch = None
        batch.settle(error)
        return True


@atexit.register
def _flush_at_exit() -> None:
    """Send the batches still queued when the interpreter ends (bounded)."""
    for client in list(_batching):
        if client._batch is not None and client._dead is None:
            try:
                client.flush_batch(EXIT_LIMIT)
            except Exception:
                pass
