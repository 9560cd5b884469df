"""``ChannelWorker`` and ``WeightedItem``: RLinf's worker that holds channel queues in its own process.

RLinf programs launch ``ChannelWorker`` (or a subclass of it) as a group and
call its methods: from the driver ``put_via_ray`` / ``get_via_ray`` /
``get_batch_via_ray``, from workers the two-step ``put(src_addr)`` /
``get(dst_addr, query_id)`` / ``get_batch(dst_addr, query_id, target)`` that
pair a group call with a point-to-point transfer.  Its queues are
``asyncio`` queues of ``WeightedItem`` (``self._queue_map[key]``), which
subclasses read and fill directly, as in RLinf.

This is not the host of ``Channel.create`` channels: those live in
``channel.ChannelHostWorker``, whose queues hold encoded items the host never
decodes (faster, and a dead consumer's item goes back to its queue).  A
``ChannelWorker`` holds decoded Python objects, as RLinf's does.

The point-to-point half of ``put`` and ``get``: RLinf sends the item with a
*piggyback payload*; here the pair travels as one object.  A producer sends
``(item, (key, weight))`` to the channel worker and then calls
``group.put(src_addr)``; a consumer calls ``group.get(dst_addr, query_id,
key)`` and receives ``(item, query_id)``, which is exactly what RLinf's
``recv`` returns on that side.
"""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass, field
from typing import Any

from ..base.address import WorkerAddress
from ..messaging.channel.local import LocalChannel
from ..worker import Worker
from .channel import DEFAULT_KEY

__all__ = ["DEFAULT_KEY", "ChannelWorker", "LocalChannel", "PeekQueue", "WeightedItem"]


@dataclass(order=True)
class WeightedItem:
    """One queued item and its weight; ordered (and compared) by weight only, as RLinf's.

    Args:
        weight: what the item counts for in ``get_batch`` (RLinf: an int; any number works).
        item: the object itself (not compared).
    """

    weight: int
    item: Any = field(compare=False)


class PeekQueue(asyncio.Queue):
    """An ``asyncio.Queue`` whose head can be looked at without taking it.

    ``await peek()`` waits for an item and returns the head, leaving it
    queued; ``peek_all()`` lists the queued items.  Peekers wait on futures of
    their own, so they never take a wake-up meant for a getter.
    """

    def __init__(self, maxsize: int = 0):
        """Args: maxsize: the most items queued at once (0: unbounded)."""
        super().__init__(maxsize)
        self._peekers: list = []

    def _put(self, item) -> None:
        super()._put(item)
        peekers, self._peekers = self._peekers, []
        for fut in peekers:
            if not fut.done():
                fut.set_result(None)

    async def peek(self) -> Any:
        """The head of the queue, waiting for one; it stays queued.  Raises ``CancelledError`` if cancelled."""
        while self.empty():
            fut = asyncio.get_running_loop().create_future()
            self._peekers.append(fut)
            try:
                await fut
            finally:
                if fut in self._peekers:
                    self._peekers.remove(fut)
        return self._queue[0]

    def peek_all(self) -> list:
        """Every queued item, head first, without taking any."""
        return list(self._queue)


class ChannelWorker(Worker):
    """The worker that holds a channel's queues: one ``PeekQueue`` of ``WeightedItem`` per key.

    Launch it with ``ChannelWorker.create_group(maxsize=N).launch(cluster, ...)``
    (RLinf launches it with a large ``max_concurrency`` so that waiting gets do
    not hold up puts; its methods are ``async``, so it is an async worker and
    calls interleave on its loop).  ``maxsize`` bounds every key's queue.
    With an accelerator, a background task empties the device cache when
    little of what is reserved is in use (``MEM_CLEAN_THRESHOLD``, checked
    every ``MEM_CLEAN_PERIOD_SECONDS``), as RLinf's does.
    """

    MEM_CLEAN_THRESHOLD = 0.4
    MEM_CLEAN_PERIOD_SECONDS = 5

    def __init__(self, maxsize: int = 0):
        """Set up the default key's queue.

        Args:
            maxsize: the most items each key's queue holds (0: unbounded).

        Raises:
            ValueError: ``maxsize`` is not an int >= 0.
        """
        super().__init__()
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
            raise ValueError(f"maxsize must be an int >= 0 (0: unbounded), got {maxsize!r}")
        self._queue_map: dict[Any, PeekQueue] = {DEFAULT_KEY: PeekQueue(maxsize=maxsize)}
        self._key_to_channel_rank: dict[Any, int] = {}
        self._pending_sends: set = set()
        self._mem_cleaner_task = None
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass  # started by the first async call, on the worker's loop
        else:
            self._start_mem_cleaner()

    # -- device memory ------------------------------------------------------------
    def _start_mem_cleaner(self) -> None:
        if self._mem_cleaner_task is None and self.has_accelerator:
            self._mem_cleaner_task = asyncio.get_running_loop().create_task(self._mem_cleaner())

    async def _mem_cleaner(self) -> None:
        """Every ``MEM_CLEAN_PERIOD_SECONDS``: empty the device cache when allocated/reserved is under the threshold."""
        threshold = ChannelWorker.MEM_CLEAN_THRESHOLD
        platform = Worker.torch_platform
        while True:
            await asyncio.sleep(ChannelWorker.MEM_CLEAN_PERIOD_SECONDS)
            if platform is None or not platform.is_initialized():
                continue
            allocated, reserved = platform.memory_allocated(), platform.memory_reserved()
            if reserved <= 0 or allocated / reserved >= threshold:
                continue
            gc.collect()
            platform.synchronize()
            platform.empty_cache()
            allocated, reserved = platform.memory_allocated(), platform.memory_reserved()
            after = allocated / reserved if reserved > 0 else 1.0
            # still under it after cleaning: what is left is in use, so only a lower ratio is worth cleaning for
            threshold = after if after < threshold else ChannelWorker.MEM_CLEAN_THRESHOLD
            self.log_debug(f"ChannelWorker memory after cleanup: {allocated} allocated, {reserved} reserved")

    def get_memory_usage(self) -> tuple[int, int]:
        """``(allocated, reserved)`` device memory in bytes of this worker; ``(0, 0)`` without an accelerator."""
        platform = Worker.torch_platform
        if self.has_accelerator and platform is not None and platform.is_initialized():
            return platform.memory_allocated(), platform.memory_reserved()
        return 0, 0

    # -- queues ---------------------------------------------------------------------
    def create_queue(self, key: Any, maxsize: int = 0) -> None:
        """Create ``key``'s queue; nothing if it exists already.

        Args:
            key: the queue's key (any hashable).
            maxsize: the most items it holds (0: unbounded).
        """
        if key not in self._queue_map:
            self._queue_map[key] = PeekQueue(maxsize=maxsize)

    def _queue(self, key: Any) -> PeekQueue:
        self.create_queue(key, self.maxsize())
        return self._queue_map[key]

    def qsize(self, key: Any = DEFAULT_KEY) -> int:
        """How many items ``key``'s queue holds (0 for a key never used).

        Args:
            key: the queue's key (default: the default key).
        """
        queue = self._queue_map.get(key)
        return 0 if queue is None else queue.qsize()

    def empty(self, key: Any = DEFAULT_KEY) -> bool:
        """Whether ``key``'s queue is empty (True for a key never used).

        Args:
            key: the queue's key (default: the default key).
        """
        return self.qsize(key) == 0

    def full(self, key: Any = DEFAULT_KEY) -> bool:
        """Whether ``key``'s queue is at its ``maxsize`` (False for a key never used).

        Args:
            key: the queue's key (default: the default key).
        """
        queue = self._queue_map.get(key)
        return False if queue is None else queue.full()

    def maxsize(self, key: Any = DEFAULT_KEY) -> int:
        """The bound of ``key``'s queue (0: unbounded).

        Args:
            key: the queue's key; for a key never used, the default queue's bound.
        """
        queue = self._queue_map.get(key, self._queue_map[DEFAULT_KEY])
        return queue.maxsize

    def peek_all(self, key: Any = DEFAULT_KEY) -> list:
        """The ``WeightedItem`` objects of ``key``'s queue, head first, leaving them queued.

        Args:
            key: the queue's key (created empty if never used).
        """
        return self._queue(key).peek_all()

    async def _enqueue(self, item: Any, weight, key: Any, nowait: bool) -> None:
        self._start_mem_cleaner()
        entry = WeightedItem(weight=weight, item=item)
        if nowait:
            self._queue(key).put_nowait(entry)  # asyncio.QueueFull when full
        else:
            await self._queue(key).put(entry)

    async def _dequeue(self, key: Any, nowait: bool) -> WeightedItem:
        self._start_mem_cleaner()
        if nowait:
            return self._queue(key).get_nowait()  # asyncio.QueueEmpty when empty
        return await self._queue(key).get()

    async def _take_batch(self, target_weight, key: Any) -> list:
        """Items from the head while their weights sum to at most ``target_weight``, waiting for more until it
        is reached or the next item would exceed it (an empty list if the head alone exceeds it)."""
        self._start_mem_cleaner()
        queue = self._queue(key)
        batch, total = [], 0
        while total < target_weight:
            head = await queue.peek()
            if total + head.weight > target_weight:
                break
            queue.get_nowait()  # the head peeked: nothing ran since
            total += head.weight
            batch.append(head.item)
        return batch

    # -- from the driver (RLinf: "via Ray") ------------------------------------------
    async def put_via_ray(self, item: Any, weight: int, key: Any = DEFAULT_KEY, nowait: bool = False) -> None:
        """Queue ``item`` under ``key`` with ``weight`` (called from the driver as a group method).

        Args:
            item: the object to queue.
            weight: what it counts for in ``get_batch``.
            key: the queue's key.
            nowait: raise instead of waiting for room.

        Raises:
            asyncio.QueueFull: ``nowait`` and the queue is full.
        """
        await self._enqueue(item, weight, key, nowait)

    async def get_via_ray(self, key: Any = DEFAULT_KEY, nowait: bool = False) -> Any:
        """Take and return the head item of ``key``, waiting for one.

        Args:
            key: the queue's key.
            nowait: raise instead of waiting for an item.

        Raises:
            asyncio.QueueEmpty: ``nowait`` and the queue is empty.
        """
        return (await self._dequeue(key, nowait)).item

    async def get_batch_via_ray(self, target_weight: int, key: Any = DEFAULT_KEY) -> list:
        """Take and return the longest head run of ``key`` whose weights sum to at most ``target_weight``.

        Waits until the run reaches the target or the next item would exceed it;
        an empty list if the head alone exceeds it.

        Args:
            target_weight: the most the taken items' weights may sum to.
            key: the queue's key.
        """
        return await self._take_batch(target_weight, key)

    # -- from workers: a group call paired with a point-to-point transfer -------------
    async def put(self, src_addr: WorkerAddress, nowait: bool = False) -> None:
        """Receive ``(item, (key, weight))`` from the worker at ``src_addr`` and queue ``item``.

        Args:
            src_addr: the producer, which sends the pair to this worker before or after this call.
            nowait: raise ``asyncio.QueueFull`` instead of waiting for room.
        """
        work = self.recv(src_addr.root_group_name, src_addr.rank_path, async_op=True)
        item, (key, weight) = await work.async_wait()
        await self._enqueue(item, weight, key, nowait)

    async def get(self, dst_addr: WorkerAddress, query_id: int, key: Any = DEFAULT_KEY, nowait: bool = False) -> None:
        """Take the head item of ``key`` and send ``(item, query_id)`` to the worker at ``dst_addr``.

        With ``nowait`` and an empty queue it sends ``(None, asyncio.QueueEmpty)`` instead, as RLinf does.
        """
        try:
            item = (await self._dequeue(key, nowait)).item
        except asyncio.QueueEmpty:
            item, query_id = None, asyncio.QueueEmpty
        self._send_back((item, query_id), dst_addr)

    async def get_batch(self, dst_addr: WorkerAddress, query_id: int, target_weight: int, key: Any = DEFAULT_KEY) -> None:
        """Take a batch as ``get_batch_via_ray`` does and send ``(batch, query_id)`` to ``dst_addr``.

        Args:
            dst_addr: the consumer, which receives the pair with ``recv``.
            query_id: the consumer's id for this request, sent back with the batch.
            target_weight: the most the taken items' weights may sum to.
            key: the queue's key.
        """
        batch = await self._take_batch(target_weight, key)
        self._send_back((batch, query_id), dst_addr)

    def _send_back(self, payload: Any, dst_addr: WorkerAddress) -> None:
        """Send without waiting (the consumer may not be receiving yet); a failure is logged."""
        work = self.send(payload, dst_addr.root_group_name, dst_addr.rank_path, async_op=True)
        self._pending_sends.add(work)

        def finished(result):
            self._pending_sends.discard(work)
            return result

        def failed(exc):
            self._pending_sends.discard(work)
            self.log_error(f"channel reply to {dst_addr.get_name()} failed: {type(exc).__name__}: {exc}")

        _on_done(work, finished, failed)

    async def ensure_key_replica(self, key: Any, src_node_rank: int = -1) -> int:
        """The rank of the replica that holds ``key``, fixed at its first use.

        Args:
            key: the queue's key.
            src_node_rank: the producer's node; its replica gets a new key when
                there is one (-1 or out of range: rank 0).
        """
        default = src_node_rank if 0 <= src_node_rank < self._world_size else 0
        return self._key_to_channel_rank.setdefault(key, default)


def _on_done(work, finished, failed) -> None:
    """Call ``finished(result)`` or ``failed(exc)`` when an ``AsyncWork`` completes."""
    future = getattr(work, "_future", None)
    if future is None:  # completed already (a work without a future)
        finished(None)
        return

    def done(f):
        exc = f.exception()
        if exc is None:
            finished(f.result())
        else:
            failed(exc)

    future.add_done_callback(done)
