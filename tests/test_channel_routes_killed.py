"""Direct routes between real worker processes on a real local Ray: a consumer SIGKILLed while it holds
items its producer sent it straight loses none of them, and delivers none twice."""

import os
import signal

import pytest

from rlinf.scheduler import Channel, NodePlacementStrategy

from launcher_marks import survives_worker_death
from p2p_helpers import Peer, run_on, wait_for


@pytest.fixture
def short_beats(monkeypatch):
    monkeypatch.setenv("RLINF_CHANNEL_HEARTBEAT", "0.5")


def _key(ch):
    from rlinf.scheduler.channel.channel import DEFAULT_KEY, _check_key

    return _check_key(DEFAULT_KEY)


def _offered(w, ch):
    """Whether the host offered this producer a route (a request makes it read what its host sent it)."""
    ch.qsize()
    return _key(ch) in ch._client(0)._out_routes


def _dialed(w, ch):
    route = ch._client(0)._out_routes.get(_key(ch))
    return route is not None and route.dialed.is_set() and route.sock is not None


def _put_all_async(w, ch, items):
    """Put ``items`` with ``async_op=True`` (the first, alone, may start the route; the rest are a burst)
    and wait for their works; then (items sent on the route, items the producer keeps for the consumer)."""
    for work in [ch.put(i, async_op=True) for i in items]:
        work.wait(10)
    route = ch._client(0)._out_routes.get(_key(ch))
    return None if route is None else (route.n, len(route.kept))


def _put_all(w, ch, items):
    """Put ``items``; then (items sent on the route, items the producer keeps for the consumer)."""
    for i in items:
        ch.put(i)
    route = ch._client(0)._out_routes.get(_key(ch))
    return None if route is None else (route.n, len(route.kept))


@survives_worker_death
@pytest.mark.parametrize("put", [_put_all, _put_all_async], ids=["sync", "async"])
def test_a_consumer_killed_holding_direct_items_loses_none(cluster, launch, short_beats, put):
    """With synchronous puts, or asynchronous ones (the first, alone, starts the route; its burst follows
    it straight to the consumer): the items the consumer held come back from the producer's copies."""
    ch = Channel.create(f"routes_killed_{put.__name__}")
    producer = launch(Peer, placement=NodePlacementStrategy([0]))
    consumer = launch(Peer, placement=NodePlacementStrategy([0]))
    run_on(producer, 0, _put_all, ch, [0]).wait()
    assert run_on(consumer, 0, lambda w, ch: ch.get(timeout=10), ch).wait() == [0]  # fed from now on
    run_on(producer, 0, put, ch, [1]).wait()  # a push on a fed key: the host offers the producer a route
    assert run_on(consumer, 0, lambda w, ch: ch.get(timeout=10), ch).wait() == [1]
    wait_for(lambda: run_on(producer, 0, _offered, ch).wait()[0], 10, "a route offered to the producer")
    wait_for(lambda: run_on(producer, 0, _dialed, ch).wait()[0], 10, "the route's link open")
    assert run_on(producer, 0, put, ch, list(range(2, 42))).wait() == [(40, 40)]  # all straight to the consumer
    assert run_on(consumer, 0, lambda w, ch: [ch.get(timeout=10) for _ in range(3)], ch).wait() == [[2, 3, 4]]
    os.kill(consumer.worker_info_list[0].pid, signal.SIGKILL)  # 37 items in its buffer or on their way
    # the producer's next put finds the route gone (its host says so, or the link fails) and goes through the
    # host, after the items the consumer had not taken, which the producer kept
    run_on(producer, 0, put, ch, [42]).wait()
    assert [ch.get(timeout=10) for _ in range(38)] == list(range(5, 43))
    assert ch.qsize() == 0
