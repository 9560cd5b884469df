"""RLinf channel idioms: any hashable key, ``local=True`` and ``distributed=True``, on a real local Ray."""

import asyncio
import enum
import pickle
import threading
import time

import pytest
import torch

from rlinf.scheduler import Channel, NodePlacementStrategy
from rlinf.scheduler.messaging.channel.keys import key_token, replica_of

from p2p_helpers import Peer, run_on


class Role(enum.Enum):
    ACTOR = 1


@pytest.fixture(scope="module")
def pair(cluster):
    g = Peer.create_group().launch(cluster, NodePlacementStrategy([0]), name="idiom_workers")
    yield g
    g.stop()


def test_key_tokens_follow_dict_key_rules():
    assert key_token(("a", 1)) == key_token(("a", 1.0)) == key_token(("a", True))
    assert key_token(("a", 1)) != key_token(("a", "1")) != key_token("a")
    assert key_token((Role.ACTOR, 0)) != key_token((1, 0))
    assert key_token("plain") == "plain"
    with pytest.raises(TypeError, match="hashable.*tuple instead of a list"):
        key_token(["a", 1])
    # the replica of a key is a pure function of the key (same in every process)
    assert all(replica_of(key_token(("k", i)), 4) == replica_of(key_token(("k", i)), 4) for i in range(50))
    assert len({replica_of(key_token(("k", i)), 4) for i in range(50)}) == 4


def test_tuple_keys_round_trip_across_processes(pair):
    ch = Channel.create("tuple_keys")
    keys = [("rollout", 0), ("rollout", 1), ("actor", b"x"), 7, None, ("nested", ("a", 2)), frozenset({1, 2})]

    def produce(w, ch, keys):
        for i, k in enumerate(keys):
            ch.put(i, key=k)
        return True

    run_on(pair, 0, produce, ch, keys).wait()
    assert [ch.get(key=k, timeout=10) for k in keys] == list(range(len(keys)))
    ch.put("one", key=1)
    assert ch.get(key=1.0, timeout=10) == "one"  # 1 and 1.0 are one dict key, hence one queue
    with pytest.raises(TypeError, match="hashable"):
        ch.put("x", key=["rollout", 0])
    assert ch.qsize(key=("rollout", 0)) == 0


def test_local_channel_in_one_process():
    ch = Channel.create("here", maxsize=2, local=True)
    assert Channel.create("here", local=True) is ch and Channel.connect("here") is ch
    t = torch.arange(4)
    ch.put(t, key=("k", 1))
    assert ch.get(key=("k", 1)) is t  # handed over as is
    ch.put(1, weight=1)
    ch.put(2, weight=1)
    assert ch.full()
    with pytest.raises(asyncio.QueueFull):
        ch.put_nowait(3)
    with pytest.raises(TimeoutError):
        ch.put(3, timeout=0.2)
    assert ch.get_batch(5, timeout=5) == [1, 2]  # a full queue returns its prefix
    with pytest.raises(asyncio.QueueEmpty):
        ch.get_nowait()
    with pytest.raises(TimeoutError):
        ch.get(timeout=0.2)
    work = ch.get(async_op=True)
    threading.Timer(0.2, lambda: ch.put("later")).start()
    assert work.wait(10) == "later"
    done = threading.Event()
    ch.put("a")
    ch.put("b")
    threading.Thread(target=lambda: (ch.put("c", timeout=10), done.set()), daemon=True).start()
    assert not done.wait(0.3)
    assert ch.get() == "a" and done.wait(10) and [ch.get(), ch.get()] == ["b", "c"]
    with pytest.raises(TypeError, match="local to the process"):
        pickle.dumps(ch)


def test_local_channel_from_a_worker(pair):
    def use(w):
        ch = w.create_channel("worker_local", local=True, maxsize=4)
        for i in range(4):
            ch.put(i, key=("r", i % 2))
        return [ch.get(key=("r", 0)), ch.get(key=("r", 0)), ch.get(key=("r", 1)), ch.get(key=("r", 1))]

    assert run_on(pair, 0, use).wait() == [[0, 2, 1, 3]]


def test_distributed_channel(cluster, pair):
    ch = Channel.create("spread", distributed=True)
    record = cluster.session.lookup_group("Channel.spread")
    assert len(record.workers) == len(cluster.nodes)  # one host per node

    def produce(w, ch):
        for i in range(20):
            ch.put(i, key=("k", i % 4))
        return True

    run_on(pair, 0, produce, ch).wait()
    assert [[ch.get(key=("k", j), timeout=10) for _ in range(5)] for j in range(4)] == \
        [list(range(j, 20, 4)) for j in range(4)]
    with pytest.raises(ValueError, match="both local"):
        Channel.create("nope", local=True, distributed=True)
