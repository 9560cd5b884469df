"""Channels: named FIFO queues between workers and the driver, on a real local Ray."""

import asyncio
import os
import signal
import threading
import time

import pytest
import torch

from rlinf.scheduler import Channel, CommunicationError, NodePlacementStrategy, PeerDiedError, WorkerMethodError
from rlinf.scheduler.channel.channel import _hosts

from p2p_helpers import Peer, await_with_ticker, run_on
from launcher_marks import survives_worker_death


@pytest.fixture(scope="module")
def workers(cluster):
    g = Peer.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="chan_workers")
    yield g
    g.stop()


def test_driver_created_channel_passed_to_workers(workers):
    ch = Channel.create("basic", maxsize=0)

    def produce(w, ch):
        for i in range(50):
            ch.put({"i": i, "t": torch.full((4,), float(i), dtype=torch.float64)}, key=f"k{i % 2}")
        return True

    def consume(w, ch):
        a = [ch.get(key="k0") for _ in range(25)]
        b = [ch.get(key="k1") for _ in range(25)]
        ok = all(x["t"].dtype == torch.float64 and float(x["t"][0]) == x["i"] for x in a + b)
        return [x["i"] for x in a], [x["i"] for x in b], ok

    c = run_on(workers, 1, consume, ch)
    run_on(workers, 0, produce, ch).wait()
    (a, b, ok), = c.wait()
    assert a == list(range(0, 50, 2)) and b == list(range(1, 50, 2)) and ok


def test_create_from_worker_with_aliases_and_connect(workers):
    def create(w):
        ch = w.create_channel(channel_name="aliased", node_rank=0, maxsize=3)
        ch.put("from worker 0")
        return ch.name

    assert run_on(workers, 0, create).wait() == ["aliased"]
    assert run_on(workers, 1, lambda w: w.connect_channel("aliased").get()).wait() == ["from worker 0"]
    again = Channel.create("aliased")  # exists: connects
    again.put(1)
    assert again.qsize() == 1 and not again.empty() and again.get() == 1 and again.empty()
    with pytest.raises(CommunicationError, match="no channel named 'never'"):
        Channel.connect("never", timeout=0.2)
    with pytest.raises(WorkerMethodError, match="unexpected keyword arguments"):
        run_on(workers, 0, lambda w: w.create_channel("x", bogus=1)).wait()


def test_nowait_errors_and_flow_control():
    ch = Channel.create("bounded", maxsize=2)
    ch.put(1)
    ch.put(2)
    assert ch.full()
    with pytest.raises(asyncio.QueueFull):
        ch.put_nowait(3)
    assert ch.get() == 1
    ch.put_nowait(3)  # the key still works after QueueFull
    assert [ch.get(), ch.get()] == [2, 3]
    with pytest.raises(asyncio.QueueEmpty):
        ch.get_nowait()
    # a blocking put waits for room
    ch.put("a")
    ch.put("b")
    done = threading.Event()
    threading.Thread(target=lambda: (ch.put("c"), done.set()), daemon=True).start()
    assert not done.wait(0.5)
    assert ch.get() == "a"
    assert done.wait(10)
    assert [ch.get(), ch.get()] == ["b", "c"]


def test_timeouts():
    ch = Channel.create("timeouts", maxsize=1)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="timed out"):
        ch.get(key="nothing", timeout=0.3)
    ch.put(1)
    with pytest.raises(TimeoutError):
        ch.put(2, timeout=0.3)
    assert time.monotonic() - start < 5
    assert ch.get() == 1 and ch.qsize() == 0  # the timed-out put left nothing behind


def test_get_batch_by_weight():
    ch = Channel.create("batches")
    for i, w in enumerate([1, 2, 3, 4]):
        ch.put(i, weight=w)
    assert ch.get_batch(3) == [0, 1]       # 1 + 2 reaches the target
    assert ch.get_batch(5) == [2]          # 3 + 4 would exceed it
    assert ch.get_batch(4) == [3]
    with pytest.raises(ValueError, match="target_weight"):
        ch.get_batch(0)
    ch.put("heavy", weight=10)
    with pytest.raises(ValueError, match="weighs 10"):
        ch.get_batch(5)
    assert ch.get() == "heavy"
    work = ch.get_batch(2, async_op=True)
    time.sleep(0.2)
    assert not work.done()  # one item of weight 1 could still grow
    ch.put("a", weight=1)
    ch.put("b", weight=1)
    assert work.wait(10) == ["a", "b"]


def test_async_ops_and_event_loop(workers):
    ch = Channel.create("asyncch")

    def consumer(w, ch):
        return await_with_ticker(ch.get(async_op=True))

    r = run_on(workers, 0, consumer, ch)
    end = time.monotonic() + 30  # its get is parked at the host (the consumer awaits it) before the wait below
    while sum(q["getters"] for q in _hosts["asyncch"].stats(True).wait()[0]["queues"].values()) < 1:
        assert time.monotonic() < end, "the consumer's get never reached the host"
        time.sleep(0.05)
    time.sleep(1.5)
    work = ch.put({"v": 1}, async_op=True)
    work.wait(10)
    (got, ticks), = r.wait()
    # a blocked event loop ticks at most once; 1.5 s of a 10 ms ticker gives ~150 even when the machine is busy
    assert got == {"v": 1} and ticks >= 5, ticks


def test_mixed_blocking_and_async_gets_on_many_keys(workers):
    ch = Channel.create("mixed")
    keys = [f"key{i}" for i in range(5)]

    def consumer(w, ch, keys):
        import threading

        results, errors = {}, []
        works = {k: [ch.get(key=k, async_op=True) for _ in range(10)] for k in keys[:3]}

        def blocking(k):
            try:
                results[k] = [ch.get(key=k, timeout=30) for _ in range(10)]
            except Exception as exc:
                errors.append(exc)

        threads = [threading.Thread(target=blocking, args=(k,)) for k in keys[3:]]
        for t in threads:
            t.start()
        for k, ws in works.items():
            results[k] = [x.wait(30) for x in ws]
        for t in threads:
            t.join(30)
        return results, [repr(e) for e in errors]

    r = run_on(workers, 1, consumer, ch, keys)
    time.sleep(0.5)
    for i in range(10):
        for k in keys:
            ch.put((k, i), key=k)
    (results, errors), = r.wait()
    assert errors == []
    assert results == {k: [(k, i) for i in range(10)] for k in keys}


def test_host_errors_reach_the_caller():
    ch = Channel.create("errs")
    with pytest.raises(CommunicationError, match="unknown channel operation 'bogus'") as info:
        ch._call({"op": "bogus", "key": "k"}, timeout=10)
    assert "Remote traceback" in str(info.value)
    ch.put(5)
    assert ch.get() == 5  # the channel keeps working


def _keys_and_items(name, expected, limit=10.0):
    """The host's (keys, items), polled until they are ``expected`` or ``limit`` s pass.  A put's commit
    (and a get's ack) is one-way on the client's connection, and the host's stats come by another path
    (a call to its worker), so they may be read just before the last commit is."""
    end = time.monotonic() + limit
    while True:
        stats = _hosts[name].stats().wait()[0]
        got = (stats["keys"], stats["items"])
        if got == expected or time.monotonic() > end:
            return got
        time.sleep(0.05)


def test_many_keys_and_items_and_bookkeeping():
    ch = Channel.create("many")
    works = [ch.put(i, key=f"k{i % 1000}", async_op=True) for i in range(10_000)]
    for w in works:
        w.wait(60)
    assert _keys_and_items("many", (1000, 10_000)) == (1000, 10_000)  # none lost, none twice
    gets = [ch.get(key=f"k{k}", async_op=True) for k in range(1000) for _ in range(10)]
    values = [g.wait(60) for g in gets]
    assert sorted(values) == list(range(10_000))
    assert _keys_and_items("many", (0, 0)) == (0, 0)


@survives_worker_death
def test_consumer_blocked_on_dead_host_raises(cluster, workers):
    ch = Channel.create("doomed")
    record = cluster.session.lookup_group("Channel.doomed")
    pid = record.workers[0].info.pid

    def consumer(w, ch):
        start = time.monotonic()
        try:
            ch.get(timeout=120)
        except PeerDiedError as exc:
            return "PeerDiedError", str(exc), time.monotonic() - start
        except Exception as exc:
            return type(exc).__name__, str(exc), time.monotonic() - start

    r = run_on(workers, 0, consumer, ch)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    kind, text, waited = r.wait()[0]
    assert kind == "PeerDiedError" and "doomed" in text and waited < 15


def test_a_channel_whose_host_was_stopped_is_created_afresh(cluster):
    """The host group this process launched for a channel was stopped: create launches a new, empty one."""
    ch = Channel.create("restartable")
    ch.put("old", timeout=20)
    host = _hosts["restartable"]
    host.stop()
    again = Channel.create("restartable")
    assert _hosts["restartable"] is not host
    again.put("new", timeout=20)
    assert again.get(timeout=20) == "new" and again.qsize() == 0


def test_a_get_batch_that_times_out_says_what_the_key_holds(cluster):
    """Items put without ``weight=`` weigh 0, so ``get_batch(2)`` waits for its whole timeout: the error
    says what the key holds and how to give items a weight, not only that it timed out."""
    from rlinf.scheduler import CommTimeoutError

    ch = Channel.create("basic")  # the first test's host, when it ran: no launch of its own
    for i in range(3):
        ch.put(i, key="weightless")
    with pytest.raises(CommTimeoutError, match=r"holds 3 item\(s\) of total weight 0, less than target_weight 2.*weight="):
        ch.get_batch(2, key="weightless", timeout=0.3)
    assert [ch.get(key="weightless", timeout=5) for _ in range(3)] == [0, 1, 2]  # nothing was taken
