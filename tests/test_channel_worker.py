"""RLinf's ``ChannelWorker`` and ``WeightedItem``, used the way RLinf programs use them, on a real local Ray."""

import asyncio
import time
import uuid

import pytest

from rlinf.scheduler import NodePlacementStrategy, Worker, WorkerGroup, WorkerMethodError
from rlinf.scheduler.channel import ChannelWorker, WeightedItem
from rlinf.scheduler.channel.channel_worker import DEFAULT_KEY, PeekQueue

from launcher_marks import TEST_LAUNCHER

BIG = 2**31 - 1  # RLinf launches its channel workers with this max_concurrency


def _launch(cluster, name, cls=ChannelWorker, maxsize=0, nodes=(0,)):
    return cls.create_group(maxsize=maxsize).launch(
        cluster, NodePlacementStrategy(list(nodes)), name=name, max_concurrency=BIG
    )


def test_weighted_item_orders_by_weight_only():
    items = sorted([WeightedItem(3, "c"), WeightedItem(1, {"unorderable": 1}), WeightedItem(2, object())])
    assert [i.weight for i in items] == [1, 2, 3]
    assert WeightedItem(1, "a") == WeightedItem(1, "b")  # the item is not compared
    assert WeightedItem(weight=5, item="x").item == "x"


def test_peek_queue_peeks_without_taking_or_stealing_a_getter_wakeup():
    async def main():
        q = PeekQueue()
        getter = asyncio.ensure_future(q.get())
        peeker = asyncio.ensure_future(q.peek())
        await asyncio.sleep(0)
        q.put_nowait("a")
        assert await asyncio.wait_for(peeker, 2) == "a"  # the head, left queued
        assert await asyncio.wait_for(getter, 2) == "a"  # the getter still got its wake-up and the item
        q.put_nowait("b")
        assert await asyncio.wait_for(q.peek(), 2) == "b"
        assert q.peek_all() == ["b"] and q.qsize() == 1

    asyncio.run(main())


def test_driver_puts_gets_and_batches_by_weight(cluster):
    g = _launch(cluster, "cw_driver")
    for i, w in enumerate([1, 2, 3, 1]):
        g.put_via_ray(f"item{i}", w).wait()
    g.put_via_ray("other", 7, key=("k", 1)).wait()
    assert g.qsize().wait() == [4]
    assert g.qsize(("k", 1)).wait() == [1]
    assert g.qsize("never").wait() == [0] and g.empty("never").wait() == [True]
    peeked = g.peek_all().wait()[0]
    assert [type(p) for p in peeked] == [WeightedItem] * 4
    assert [(p.weight, p.item) for p in peeked] == [(1, "item0"), (2, "item1"), (3, "item2"), (1, "item3")]
    # the head run that fits: 1 + 2 = 3 reaches the target
    assert g.get_batch_via_ray(3).wait() == [["item0", "item1"]]
    # 3 fits, 3 + 1 would exceed 3.5: stops before it
    assert g.get_batch_via_ray(3.5).wait() == [["item2"]]
    assert g.get_via_ray().wait() == ["item3"]
    assert g.get_via_ray(key=("k", 1)).wait() == ["other"]
    with pytest.raises(WorkerMethodError) as err:
        g.get_via_ray(nowait=True).wait()
    assert "QueueEmpty" in err.value.exc_type
    g.stop()


def test_get_batch_waits_until_the_target_is_reached(cluster):
    g = _launch(cluster, "cw_batch_wait")
    batch = g.get_batch_via_ray(4, key="b")
    g.put_via_ray("x", 1, key="b").wait()
    g.put_via_ray("y", 2, key="b").wait()
    time.sleep(0.3)
    assert not batch.done()  # 3 < 4: more items may come and fit
    g.put_via_ray("z", 1, key="b").wait()
    assert batch.wait() == [["x", "y", "z"]]
    g.stop()


def test_maxsize_bounds_every_key(cluster):
    g = _launch(cluster, "cw_bounded", maxsize=2)
    assert g.maxsize().wait() == [2]
    g.put_via_ray(1, 0, key="q").wait()
    g.put_via_ray(2, 0, key="q").wait()
    assert g.full("q").wait() == [True]
    with pytest.raises(WorkerMethodError) as err:
        g.put_via_ray(3, 0, key="q", nowait=True).wait()
    assert "QueueFull" in err.value.exc_type
    blocked = g.put_via_ray(3, 0, key="q")  # waits for room
    time.sleep(0.3)
    assert not blocked.done()
    assert g.get_via_ray(key="q").wait() == [1]
    blocked.wait()
    assert [p.item for p in g.peek_all("q").wait()[0]] == [2, 3]
    g.stop()


class Producer(Worker):
    def produce(self, channel_name, items):
        group = WorkerGroup.from_group_name(ChannelWorker, channel_name)
        for item, key, weight in items:
            self.send((item, (key, weight)), channel_name, 0)  # RLinf: send(item, piggyback_payload=(key, weight))
            group.put(self.worker_address).wait()
        return len(items)


class Consumer(Worker):
    def consume(self, channel_name, key, n):
        group = WorkerGroup.from_group_name(ChannelWorker, channel_name)
        out = []
        for _ in range(n):
            query_id = uuid.uuid4().int
            call = group.get(self.worker_address, query_id, key)
            item, qid = self.recv(channel_name, 0)
            call.wait()
            assert qid == query_id
            out.append(item)
        return out

    def consume_batch(self, channel_name, key, target):
        group = WorkerGroup.from_group_name(ChannelWorker, channel_name)
        call = group.get_batch(self.worker_address, 7, target, key)
        batch, qid = self.recv(channel_name, 0)
        call.wait()
        return batch, qid


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="attaches to groups by name from workers")
def test_workers_put_and_get_point_to_point(cluster):
    g = _launch(cluster, "cw_p2p")
    producer = Producer.create_group().launch(cluster, NodePlacementStrategy([0]), name="cw_producer")
    consumer = Consumer.create_group().launch(cluster, NodePlacementStrategy([0]), name="cw_consumer")
    items = [({"n": i}, "work", i % 3) for i in range(6)]
    assert producer.produce("cw_p2p", items).wait() == [6]
    assert g.qsize("work").wait() == [6]
    assert consumer.consume("cw_p2p", "work", 2).wait() == [[{"n": 0}, {"n": 1}]]
    # weights left: 2 (n=2), 0, 1, 2: a target of 3 takes 2 + 0 + 1
    batch, qid = consumer.consume_batch("cw_p2p", "work", 3).wait()[0]
    assert batch == [{"n": 2}, {"n": 3}, {"n": 4}] and qid == 7
    assert [p.item for p in g.peek_all("work").wait()[0]] == [{"n": 5}]
    for group in (producer, consumer, g):
        group.stop()


class TaggingChannelWorker(ChannelWorker):
    """An RLinf-style subclass: it fills ``_queue_map`` itself and calls the base class's methods."""

    def __init__(self, maxsize: int = 0):
        super().__init__(maxsize=maxsize)
        self.seen = 0

    async def put_via_ray(self, item, weight, key=DEFAULT_KEY, nowait=False):
        self.seen += 1
        self.create_queue(key, self.maxsize())
        await self._queue_map[key].put(WeightedItem(weight=weight, item=("tagged", item)))

    async def get_via_ray(self, key=DEFAULT_KEY, nowait=False):
        return await super().get_via_ray(key, nowait)

    def count(self):
        return self.seen


def test_subclass_uses_queue_map_and_base_methods(cluster):
    g = _launch(cluster, "cw_subclass", cls=TaggingChannelWorker)
    g.put_via_ray("a", 1).wait()
    g.put_via_ray("b", 1).wait()
    assert g.count().wait() == [2]
    assert g.get_via_ray().wait() == [("tagged", "a")]
    assert g.get_batch_via_ray(1).wait() == [[("tagged", "b")]]
    g.stop()


def test_ensure_key_replica_pins_each_key_to_a_replica(cluster):
    g = _launch(cluster, "cw_replicas", nodes=(0, 0))
    first = g.execute_on(0).ensure_key_replica(key="a", src_node_rank=1).wait()
    assert first == [1]
    # fixed at first use, whatever the next producer's node
    assert g.execute_on(0).ensure_key_replica(key="a", src_node_rank=0).wait() == [1]
    # a node with no replica: rank 0
    assert g.execute_on(0).ensure_key_replica(key="b", src_node_rank=5).wait() == [0]
    g.stop()
