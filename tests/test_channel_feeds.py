"""Feeds: a key's only consumer gets its items sent ahead, and nothing a user can observe changes.

Each test checks what a feed must keep: items fed ahead still count in
``qsize``; another consumer coming (a get, ``get_nowait``, ``get_batch``)
gets the head of the queue, in order; a consumer that dies, stops or goes
idle holding fed items gives them back; a fed get that times out takes
nothing; and every item is delivered exactly once.
"""

import asyncio
import os
import time

import pytest

from rlinf.scheduler import Channel, NodePlacementStrategy
from rlinf.scheduler.channel.channel import _hosts
from rlinf.scheduler.messaging.channel.feeding import FEED_IDLE

from p2p_helpers import Peer, run_on, wait_for


@pytest.fixture(scope="module")
def consumer(cluster):
    g = Peer.create_group().launch(cluster, NodePlacementStrategy([0]), name="feed_consumer")
    yield g
    g.stop()


def _stats(name, detail=False):
    return _hosts[name].stats(detail).wait()[0]


def _fed(ch, key="default_queue"):
    """Whether the worker's connection holds a feed on ``key`` (asked in the worker)."""
    from rlinf.scheduler.channel.channel import _clients

    client = _clients.get((ch.name, 0))
    return client is not None and client.has_feed(key)


def test_fed_items_count_and_another_consumer_takes_the_head_in_order(consumer):
    ch = Channel.create("feed_order")
    for i in range(6):
        ch.put(i)
    assert run_on(consumer, 0, lambda w, ch: (ch.get(), _fed(ch)), ch).wait() == [(0, True)]
    # the other five were sent ahead to the worker, not handed out: still queued for everyone
    wait_for(lambda: _stats("feed_order")["in_flight"] == 5, 10, "the rest fed ahead")
    assert ch.qsize() == 5 and not ch.empty()
    # the driver is a second consumer: the feed is recalled and the driver gets the head
    assert ch.get(timeout=10) == 1
    assert ch.get_nowait() == 2
    assert run_on(consumer, 0, lambda w, ch: [ch.get(timeout=10) for _ in range(3)], ch).wait() == [[3, 4, 5]]
    assert ch.qsize() == 0
    with pytest.raises(asyncio.QueueEmpty):
        ch.get_nowait()


def test_get_nowait_finds_items_fed_to_another_consumer(consumer):
    ch = Channel.create("feed_nowait")
    for i in range(4):
        ch.put(i)
    assert run_on(consumer, 0, lambda w, ch: ch.get(), ch).wait() == [0]
    wait_for(lambda: _stats("feed_nowait")["in_flight"] == 3, 10, "the rest fed ahead")
    assert [ch.get_nowait() for _ in range(3)] == [1, 2, 3]


def test_other_takes_on_the_same_connection_keep_fifo(consumer):
    ch = Channel.create("feed_same_conn")
    for i in range(8):
        ch.put(i, weight=1)

    def takes(w, ch):
        first = ch.get()
        fed = _fed(ch)
        batch = ch.get_batch(target_weight=2)  # ends the feed first: its items go back to the head
        later = ch.get(async_op=True).wait(10)
        nowait = ch.get_nowait()
        rest = [ch.get(timeout=10) for _ in range(2)]
        return first, fed, batch, later, nowait, rest

    assert run_on(consumer, 0, takes, ch).wait() == [(0, True, [1, 2], 3, 4, [5, 6])]
    assert ch.get(timeout=10) == 7


def test_a_fed_get_that_times_out_takes_nothing(consumer):
    ch = Channel.create("feed_timeout")
    ch.put("a")

    def waits(w, ch):
        first = ch.get()
        start = time.monotonic()
        try:
            ch.get(timeout=0.3)
        except Exception as exc:
            return first, _fed(ch), type(exc).__name__, time.monotonic() - start
        return first, _fed(ch), "no error", 0.0

    (first, fed, error, took), = run_on(consumer, 0, waits, ch).wait()
    assert (first, fed, error) == ("a", True, "CommTimeoutError") and 0.25 < took < 5
    ch.put("b")
    assert run_on(consumer, 0, lambda w, ch: ch.get(timeout=10), ch).wait() == ["b"]


def test_a_consumer_killed_holding_fed_items_loses_none(launch):
    ch = Channel.create("feed_killed")
    victim = launch(Peer, placement=NodePlacementStrategy([0]))
    for i in range(5):
        ch.put(i)

    def take_one_then_die(w, ch):
        ch.get()
        end = time.monotonic() + 10
        while time.monotonic() < end and _stats_local(ch) < 4:
            time.sleep(0.01)
        os._exit(1)

    with pytest.raises(Exception):
        run_on(victim, 0, take_one_then_die, ch).wait()
    assert [ch.get(timeout=15) for _ in range(4)] == [1, 2, 3, 4]
    assert ch.qsize() == 0


def _stats_local(ch) -> int:
    """Items fed ahead and waiting in this process's buffer for ``ch``'s default key."""
    from rlinf.scheduler.channel.channel import _clients

    client = _clients.get((ch.name, 0))
    feed = None if client is None else client._feeds.get("default_queue")
    return 0 if feed is None else len(feed.buffer)


def test_a_stopped_consumer_and_an_idle_feed_give_their_items_back(cluster, launch):
    ch = Channel.create("feed_stopped")
    for i in range(5):
        ch.put(i)
    group = launch(Peer, placement=NodePlacementStrategy([0]))
    assert run_on(group, 0, lambda w, ch: ch.get(), ch).wait() == [0]
    group.stop()
    assert [ch.get(timeout=15) for _ in range(4)] == [1, 2, 3, 4]

    idle = Channel.create("feed_idle")
    for i in range(3):
        idle.put(i)
    other = launch(Peer, placement=NodePlacementStrategy([0]))
    assert run_on(other, 0, lambda w, ch: ch.get(), idle).wait() == [0]
    wait_for(lambda: _stats("feed_idle")["in_flight"] == 2, 10, "the rest fed ahead")
    # nobody else asks: the worker ends its idle feed by itself and the items are queued again
    wait_for(lambda: _stats("feed_idle")["in_flight"] == 0, FEED_IDLE + 5, "the idle feed's items returned")
    assert _stats("feed_idle", True)["queues"]["'default_queue'"]["items"] == 2
    assert [idle.get(timeout=10) for _ in range(2)] == [1, 2]


def test_bounded_channels_and_shared_keys_are_not_fed(consumer):
    bounded = Channel.create("feed_bounded", maxsize=4)
    for i in range(4):
        bounded.put(i)
    assert run_on(consumer, 0, lambda w, ch: (ch.get(), _fed(ch)), bounded).wait() == [(0, False)]
    assert bounded.qsize() == 3 and _stats("feed_bounded")["in_flight"] == 0

    shared = Channel.create("feed_shared")
    for i in range(6):
        shared.put(i)
    assert run_on(consumer, 0, lambda w, ch: ch.get(), shared).wait() == [0]
    assert shared.get(timeout=10) == 1  # a second consumer: the key is shared from now on
    assert run_on(consumer, 0, lambda w, ch: (ch.get(timeout=10), _fed(ch)), shared).wait() == [(2, False)]
    assert shared.qsize() == 3 and _stats("feed_shared")["in_flight"] == 0


def test_a_stream_through_a_feed_is_delivered_once_in_order(consumer):
    ch = Channel.create("feed_stream")
    n = 3000
    got = run_on(consumer, 0, lambda w, ch, n: [ch.get(timeout=30) for _ in range(n)], ch, n)
    for i in range(n):
        ch.put(i, async_op=True)
    assert got.wait() == [list(range(n))]
    assert ch.qsize() == 0 and _stats("feed_stream")["in_flight"] == 0


def test_acks_on_the_ack_link_count_when_the_consumer_dies(launch):
    """Once fed, a consumer acknowledges on its second link; the host reads that link to its end before it puts
    a departed consumer's items back: the items its gets returned are not delivered again, the rest are."""
    ch = Channel.create("feed_ack_link")
    victim = launch(Peer, placement=NodePlacementStrategy([0]))
    for i in range(20):
        ch.put(i)

    def take_ten_then_die(w, ch):
        from rlinf.scheduler.channel.channel import _clients

        got = [ch.get()]
        client = _clients[(ch.name, 0)]
        end = time.monotonic() + 10
        while client._ack_link is None and time.monotonic() < end:  # opened by the heartbeat thread
            time.sleep(0.01)
        got = [*got, *(ch.get() for _ in range(9))]
        os._exit(3 if client._ack_link is not None and got == list(range(10)) else 4)

    with pytest.raises(Exception, match="code 3"):  # the ten taken through the ack link
        run_on(victim, 0, take_ten_then_die, ch).wait()
    assert [ch.get(timeout=15) for _ in range(10)] == list(range(10, 20))
    assert ch.qsize() == 0
