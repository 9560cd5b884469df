"""Fault injection with real processes: the survivors raise within a bounded
time, the error names who failed first, nothing is left behind, and the
cluster launches new groups afterwards."""

import os
import signal
import time

import pytest
import torch

from rlinf.scheduler import (
    Channel,
    NodePlacementStrategy,
    PeerDiedError,
    WorkerDiedError,
    WorkerMethodError,
)

from p2p_helpers import Peer, process_alive, run_on, ship


def _gone(pids, within=15.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(process_alive(p) for p in pids):
        time.sleep(0.1)
    return not any(process_alive(p) for p in pids)


def _cluster_still_launches(launch):
    g = launch(Peer, placement=NodePlacementStrategy([0]))
    assert g.pid().wait()


def _kill_during(launch, name, body, victim=1, delay=1.0):
    """Start ``body`` on every rank of a fresh pair, SIGKILL ``victim`` mid-way, return the raised error."""
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]), name=name)
    pids = g.pid().wait()
    handle = g.run(ship(body))
    time.sleep(delay)
    os.kill(pids[victim], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        handle.wait(timeout=60)
    elapsed = time.monotonic() - start
    survivors = [p for i, p in enumerate(pids) if i != victim]
    g.stop()
    assert _gone(pids), "a worker process was left behind"
    _cluster_still_launches(launch)
    return info.value, elapsed, survivors


def test_kill_during_group_call(launch):
    err, elapsed, _ = _kill_during(launch, "f_call", lambda w: time.sleep(60))
    assert err.rank == 1 and err.group == "f_call" and err.method == "run" and elapsed < 15


def test_kill_during_send_reports_the_dead_receiver(launch):
    def body(w):
        name = w.worker_group_name
        if w._rank == 0:  # keeps sending 4 MiB tensors to rank 1, which dies mid-stream
            for _ in range(100_000):
                w.send(torch.ones(1 << 20), name, 1, timeout=30)
        else:
            for _ in range(100_000):
                w.recv(name, 0)
                time.sleep(0.01)

    err, elapsed, _ = _kill_during(launch, "f_send", body)
    assert isinstance(err, WorkerDiedError) and err.rank == 1 and elapsed < 15  # the cause, not rank 0's echo
    others = [e for e in err.errors if e is not err]
    assert all(getattr(e, "secondary", False) for e in others if isinstance(e, WorkerMethodError))


def test_kill_during_recv(launch):
    def body(w):
        name = w.worker_group_name
        if w._rank == 0:
            w.recv(name, 1, timeout=60)  # rank 1 never sends, then dies
        else:
            time.sleep(60)

    err, elapsed, _ = _kill_during(launch, "f_recv", body)
    assert err.rank == 1 and elapsed < 15


def test_raise_on_one_rank_of_eight_names_that_rank(launch):
    g = launch(Peer, placement=NodePlacementStrategy([0] * 8), name="f_eight")

    def body(w):
        if w._rank == 5:
            time.sleep(0.2)
            raise RuntimeError("rank five failed first")
        return w.recv(w.worker_group_name, 5, timeout=8)  # echoes: timeouts waiting for rank 5

    start = time.monotonic()
    with pytest.raises(WorkerMethodError) as info:
        g.run(ship(body)).wait(timeout=60)
    assert info.value.rank == 5 and "rank five failed first" in str(info.value)
    assert time.monotonic() - start < 20
    # the survivors' own waits are bounded: they all come back with a timeout naming rank 5
    results = g.run(ship(lambda w: "alive")).wait(timeout=30)
    assert results == ["alive"] * 8


def test_kill_during_channel_put_and_get(cluster, launch):
    ch = Channel.create("f_chan", maxsize=1)
    ch.put("fills the channel")

    def blocked_put(w, ch):
        ch.put("parked item", timeout=60)

    def blocked_get(w, ch):
        return ch.get(key="other", timeout=60)

    g = launch(Peer, placement=NodePlacementStrategy([0, 0]), name="f_chan_workers")
    pids = g.pid().wait()
    putting = run_on(g, 0, blocked_put, ch)
    getting = run_on(g, 1, blocked_get, ch)
    time.sleep(1.0)
    for p in pids:
        os.kill(p, signal.SIGKILL)
    for handle in (putting, getting):
        with pytest.raises(WorkerDiedError):
            handle.wait(timeout=30)
    # the channel lives on; the item the killed producer had sent is not lost
    assert ch.get(timeout=10) == "fills the channel"
    assert ch.get(timeout=10) == "parked item"
    ch.put("next", key="other")
    assert ch.get(key="other", timeout=10) == "next"  # the dead getter took nothing
    g.stop()
    assert _gone(pids)


def test_kill_channel_host(cluster, launch):
    ch = Channel.create("f_host")
    host_pid = cluster.session.lookup_group("Channel.f_host").workers[0].info.pid
    g = launch(Peer, placement=NodePlacementStrategy([0]), name="f_host_consumer")
    waiting = run_on(g, 0, lambda w, ch: ch.get(timeout=60), ch)
    time.sleep(1.0)
    os.kill(host_pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerMethodError) as info:
        waiting.wait(timeout=30)
    assert "PeerDiedError" in str(info.value) and "f_host" in str(info.value) and time.monotonic() - start < 15
    with pytest.raises(PeerDiedError):
        ch.put(1)
    assert _gone([host_pid])
    _cluster_still_launches(launch)


def test_a_group_relaunched_under_the_same_name_is_reachable_again(cluster, launch):
    a = launch(Peer, placement=NodePlacementStrategy([0]), name="f_keeper")

    def talk(w):
        w.send("ping", "f_phoenix", 0, timeout=30)
        return w.recv("f_phoenix", 0, timeout=30)

    def answer(w):
        return w.send(("pong", w.recv("f_keeper", 0, timeout=30), os.getpid()), "f_keeper", 0, timeout=30)

    pids = []
    for round_ in range(2):
        b = Peer.create_group().launch(cluster, NodePlacementStrategy([0]), name="f_phoenix")
        pids.append(b.pid().wait()[0])
        reply = run_on(b, 0, answer)
        got = run_on(a, 0, talk).wait(timeout=60)[0]
        reply.wait(timeout=30)
        assert got[:2] == ("pong", "ping") and got[2] == pids[-1]
        if round_ == 0:
            os.kill(pids[0], signal.SIGKILL)
            assert _gone([pids[0]])
            b.stop()
            with pytest.raises(WorkerMethodError, match="PeerDiedError|no group named"):
                run_on(a, 0, lambda w: w.recv("f_phoenix", 0, timeout=30)).wait(timeout=60)
        else:
            b.stop()
