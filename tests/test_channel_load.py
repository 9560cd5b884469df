"""Channels under load: a fixed set of host threads, keys that do not wait on each other, nothing lost.

On a real local Ray, with real processes and real connections; host-side
limits are set through the ``RLINF_CHANNEL_*`` settings, which the launching
process forwards to the channel's host.
"""

import collections
import json
import time

import psutil
import pytest

from rlinf.scheduler import Channel, NodePlacementStrategy
from rlinf.scheduler.channel.channel import _hosts
from rlinf.scheduler.messaging.channel.client import ChannelClient, _client_transport
from rlinf.scheduler.messaging.channel.protocol import pack
from rlinf.scheduler.plugins import get_registry

from p2p_helpers import Peer, run_on, wait_for


def _record(cluster, name):
    return cluster.session.lookup_group("Channel." + name).workers[0]


def test_host_threads_do_not_grow_with_clients(cluster):
    """4 clients or 24: the host runs the same threads (one loop and a few senders, not one per client)."""
    name = "load_threads"
    ch = Channel.create(name)
    ch.put("warm")
    assert ch.get(timeout=30) == "warm"
    host = psutil.Process(_record(cluster, name).info.pid)
    clients = []

    def connect(n):
        for _ in range(n):
            c = ChannelClient.connect(name, f"Channel.{name}:0", _record(cluster, name))
            _, fut = c.request({"op": "qsize", "key": "k"})
            assert fut.result(30)[0]["value"] == 0  # served
            clients.append(c)
        wait_for(lambda: _hosts[name].stats().wait()[0]["clients"] == len(clients) + 1, 20, "clients registered")

    try:
        connect(4)
        time.sleep(0.2)  # handshake threads of the gate end once their client is handed over
        with_4 = host.num_threads()
        connect(20)
        # the gate's handshake threads are short-lived: the count settles back, it does not stay 20 higher
        wait_for(lambda: host.num_threads() <= with_4 + 2, 20, f"host threads back near {with_4}")
        assert _hosts[name].stats().wait()[0]["clients"] == 25
    finally:
        for c in clients:
            c.close(grace=2.0)
    wait_for(lambda: _hosts[name].stats().wait()[0]["clients"] == 1, 20, "departed clients forgotten")


def test_a_consumer_that_does_not_read_stalls_no_other_key(cluster, monkeypatch):
    """A consumer whose socket is full keeps its own replies waiting, and nobody else's.

    A raw connection parks 200 gets on key "slow" and never reads: the host's
    replies fill its socket.  The producer that fed it keeps putting and
    getting on key "fast" at its usual pace, and once the stuck connection
    closes, all 200 items come back, in order.
    """
    monkeypatch.setenv("RLINF_CHANNEL_SEND_TIMEOUT", "120")  # not dropped during the test for not reading
    monkeypatch.setenv("RLINF_CHANNEL_HEARTBEAT", "30")
    name = "load_stuck"
    ch = Channel.create(name)

    def round_trips(n):
        start = time.monotonic()
        for i in range(n):
            ch.put(i, key="fast", timeout=30)
            assert ch.get(key="fast", timeout=30) == i
        return time.monotonic() - start

    round_trips(10)  # warm
    alone = round_trips(50)

    record = _record(cluster, name)
    transport = _client_transport(get_registry().transport("cpu", "cpu"))
    hello = json.dumps({"service": "channel", "channel": name, "client": "stuck"}).encode()
    stuck = transport.connect(record.endpoints["cpu"], hello, time.monotonic() + 30)
    try:
        for rid in range(1, 201):
            stuck.send([pack({"op": "get", "key": "slow", "id": rid, "timeout": None})], time.monotonic() + 30)
        chunk = b"x" * (48 << 10)  # below the shared-memory threshold: every reply travels inline
        for i in range(200):
            ch.put((i, chunk), key="slow", timeout=30)
        beside = round_trips(50)
        stats = _hosts[name].stats(True).wait()[0]
        # all 200 sent its way and none dropped (plus, at most, the last "fast" item, acknowledged lazily)
        assert stats["clients"] == 2 and 200 <= stats["in_flight"] <= 201, stats
    finally:
        stuck.close()
    assert beside < 10 * alone + 20, f"50 round trips took {beside:.2f} s beside the stuck consumer, {alone:.2f} s alone"
    got = [ch.get(key="slow", timeout=30)[0] for _ in range(200)]
    assert got == list(range(200))  # put back at the head of their queue, in order
    assert ch.qsize(key="slow") == 0


def test_many_producers_and_consumers_on_several_keys(cluster, launch):
    """16 producers and 16 consumers (threads in 2 workers and this process) on 4 keys of a bounded
    channel: every item arrives exactly once, and each consumer sees each producer's items in order."""
    name = "load_many"
    keys, per_key, n = 4, 4, 50  # 4 producers and 4 consumers per key, 50 items per producer
    ch = Channel.create(name, maxsize=4)  # full queues park producers, empty ones park consumers
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]))

    def run_threads(w, ch, jobs, n):
        """Producers ("put", producer, key) put n items; consumers ("get", key) take n."""
        import threading

        def body(i, job):
            if job[0] == "put":
                for seq in range(n):
                    ch.put((job[2], job[1], seq), key=job[2], timeout=60)
            else:
                out[i] = [ch.get(key=job[1], timeout=60) for _ in range(n)]

        out, threads = [None] * len(jobs), []
        for i, job in enumerate(jobs):
            threads.append(threading.Thread(target=body, args=(i, job)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        return out

    jobs = {0: [], 1: [], 2: []}  # rank 0, rank 1, this process (2)
    for k in range(keys):
        for j in range(per_key):
            producer = k * per_key + j
            jobs[producer % 3].append(("put", producer, f"k{k}"))
            jobs[(producer + 1) % 3].append(("get", f"k{k}"))
    pending = [run_on(g, r, run_threads, ch, jobs[r], n) for r in (0, 1)]
    results = run_threads(None, ch, jobs[2], n) + pending[0].wait()[0] + pending[1].wait()[0]
    received = [batch for batch in results if isinstance(batch, list)]
    assert len(received) == keys * per_key
    seen = collections.Counter(item for batch in received for item in batch)
    expected = {(f"k{p // per_key}", p, s) for p in range(keys * per_key) for s in range(n)}
    assert set(seen) == expected and max(seen.values()) == 1  # nothing lost, nothing twice
    for batch in received:
        assert len({key for key, _, _ in batch}) == 1  # one key's items only
        by_producer = collections.defaultdict(list)
        for _, producer, seq in batch:
            by_producer[producer].append(seq)
        assert all(seqs == sorted(seqs) for seqs in by_producer.values())  # FIFO per key per producer
    # acknowledgements ride on the next request or follow within 0.2 s
    wait_for(lambda: _hosts[name].stats().wait()[0]["in_flight"] == 0, 10, "every item acknowledged")
    assert _hosts[name].stats().wait()[0]["items"] == 0
