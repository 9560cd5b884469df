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
    CommTimeoutError,
    NodePlacementStrategy,
    PeerDiedError,
    WorkerDiedError,
    WorkerMethodError,
)

from p2p_helpers import Peer, process_alive, run_on, ship


def _gone(pids, within=60.0):
    """True once every one of ``pids`` has ended; False, with what is still running printed, after ``within`` s.

    A worker stopped through Ray ends about 0.1 s after ``stop()`` here; Ray's kill is asynchronous, and
    on a loaded machine whose cluster has just started it once took over 15 s. A process left behind
    for good still fails: the bound only gives Ray's kill room on a slow machine.
    """
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and any(process_alive(p) for p in pids):
        time.sleep(0.1)
    alive = [p for p in pids if process_alive(p)]
    for p in alive:
        print(f"still running after {within:.0f} s: {_describe(p)}")
    return not alive


def _describe(pid) -> str:
    """What /proc says about ``pid``: state, parent, where it sleeps in the kernel, its command line."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        return f"pid {pid} state {fields[0]} ppid {fields[1]} wchan {wchan} threads {fields[17]}: {cmdline}"
    except OSError as exc:
        return f"pid {pid}: {exc}"


def resources(pid) -> dict:
    """File descriptors, threads and memfd mappings of ``pid``, read from /proc (not from our code)."""
    with open(f"/proc/{pid}/maps") as f:
        memfd = sum("memfd:" in line for line in f)
    return {"fds": len(os.listdir(f"/proc/{pid}/fd")), "threads": len(os.listdir(f"/proc/{pid}/task")), "memfd": memfd}


def _cluster_still_launches(launch):
    g = launch(Peer, placement=NodePlacementStrategy([0]))
    assert g.pid().wait()


def recording(body):
    """``body`` that also keeps how it ended in the worker: (error type or "returned", message, peer, time.time())."""

    def recorded(w, *args):
        try:
            value = body(w, *args)
        except BaseException as exc:
            w.state["outcome"] = (type(exc).__name__, str(exc), getattr(exc, "peer", None), time.time())
            raise
        w.state["outcome"] = ("returned", repr(value)[:200], None, time.time())
        return value

    return recorded


def outcome_of(group, rank, within=60.0):
    """How ``body`` ended on ``rank``; waits (bounded) for a rank still inside it."""
    deadline = time.monotonic() + within
    while True:
        got = run_on(group, rank, lambda w: w.state.pop("outcome", None)).wait(timeout=within)[0]
        if got is not None or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def _kill_during(launch, name, body, victim=1, delay=1.0):
    """Start ``body`` on every rank of a fresh pair, SIGKILL ``victim`` mid-way.

    Returns the error the driver got, how long it took, each survivor's outcome (and
    seconds from the kill to it), and each survivor's resources before and after.
    """
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]), name=name)
    pids = g.pid().wait()
    survivors = [r for r in range(len(pids)) if r != victim]
    before = {r: resources(pids[r]) for r in survivors}
    handle = g.run(ship(recording(body)))
    time.sleep(delay)
    os.kill(pids[victim], signal.SIGKILL)
    killed_at = time.time()
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        handle.wait(timeout=60)
    elapsed = time.monotonic() - start
    outcomes = {}
    for r in survivors:
        kind, message, peer, at = outcome_of(g, r)
        outcomes[r] = (kind, message, peer, at - killed_at)
    after = {r: resources(pids[r]) for r in survivors}
    g.stop()
    assert _gone(pids), "a worker process was left behind"
    _cluster_still_launches(launch)
    err = info.value
    # the dead rank is the error reported, with group, rank and method; no other rank is blamed for dying
    assert err.rank == victim and err.group == name and err.method == "run"
    assert [e.rank for e in err.errors if isinstance(e, WorkerDiedError)] == [victim]
    return err, elapsed, outcomes, before, after


def _assert_released(before, after, label):
    """A survivor holds no more descriptors, threads or shared memory than before it met the dead peer."""
    for r in before:
        b, a = before[r], after[r]
        assert a["fds"] <= b["fds"] + 2, f"{label}: rank {r} kept {a['fds'] - b['fds']} descriptors: {b} -> {a}"
        assert a["threads"] <= b["threads"] + 2, f"{label}: rank {r} kept {a['threads'] - b['threads']} threads: {b} -> {a}"
        assert a["memfd"] <= b["memfd"], f"{label}: rank {r} kept shared memory of the dead peer: {b} -> {a}"


def test_kill_during_group_call(launch):
    def body(w):
        time.sleep(3 if w._rank == 0 else 60)  # rank 0 talks to nobody: the death must not disturb it
        return w._rank

    err, elapsed, outcomes, before, after = _kill_during(launch, "f_call", body)
    assert elapsed < 15
    kind, _, _, _ = outcomes[0]
    assert kind == "returned", outcomes[0]
    _assert_released(before, after, "group call")


def test_kill_during_send_reports_the_dead_receiver(launch):
    def body(w):
        name = w.worker_group_name
        if w._rank == 0:  # keeps sending 4 MiB tensors to rank 1, which dies mid-stream
            for _ in range(100_000):
                w.send(torch.ones(1 << 20), name, 1, timeout=90)
        else:
            for _ in range(100_000):
                w.recv(name, 0)
                time.sleep(0.01)

    err, elapsed, outcomes, before, after = _kill_during(launch, "f_send", body)
    assert isinstance(err, WorkerDiedError) and elapsed < 15  # the cause, not rank 0's echo
    others = [e for e in err.errors if e is not err]
    assert all(getattr(e, "secondary", False) for e in others if isinstance(e, WorkerMethodError))
    kind, message, peer, after_kill = outcomes[0]
    # the sender fails with PeerDiedError naming the dead receiver, long before its own 90 s timeout
    # (about a second on a quiet machine; the bound leaves room for a loaded one)
    assert kind == "PeerDiedError" and "f_send:1" in message, outcomes[0]
    assert after_kill < 45, outcomes[0]
    _assert_released(before, after, "send")


def test_kill_during_recv(launch):
    def body(w):
        name = w.worker_group_name
        if w._rank == 0:
            w.recv(name, 1, timeout=90)  # rank 1 never sends, then dies
        else:
            time.sleep(60)

    err, elapsed, outcomes, before, after = _kill_during(launch, "f_recv", body)
    assert elapsed < 15
    kind, message, peer, after_kill = outcomes[0]
    assert kind == "PeerDiedError" and "f_recv:1" in message, outcomes[0]  # not a CommTimeoutError after 90 s
    assert after_kill < 45, outcomes[0]
    _assert_released(before, after, "recv")


RECV_TIMEOUT = 10  # far past the error grace (2 s) even if the 8 ranks start the body seconds apart


def test_raise_on_one_rank_of_eight_names_that_rank(launch):
    g = launch(Peer, placement=NodePlacementStrategy([0] * 8), name="f_eight")

    def body(w):
        if w._rank == 5:
            time.sleep(0.2)
            raise RuntimeError("rank five failed first")
        # echoes: timeouts waiting for rank 5; RECV_TIMEOUT is past the error grace (2 s), so rank 5's own
        # error is in hand first, and short, since every survivor waits it out
        return w.recv(w.worker_group_name, 5, timeout=RECV_TIMEOUT)

    start, wall_start = time.monotonic(), time.time()
    with pytest.raises(WorkerMethodError) as info:
        g.run(ship(recording(body))).wait(timeout=60)
    assert info.value.rank == 5 and "rank five failed first" in str(info.value)
    assert "RuntimeError" in (info.value.remote_traceback or "") and info.value.group == "f_eight"
    assert time.monotonic() - start < 30
    # every rank: rank 5 raised its own error; each survivor's wait ended by its own timeout, naming rank 5
    for rank in range(8):
        kind, message, peer, at = outcome_of(g, rank)
        if rank == 5:
            assert kind == "RuntimeError" and "rank five failed first" in message
        else:
            assert kind == "CommTimeoutError" and "f_eight:5" in message, (rank, kind, message)
            assert RECV_TIMEOUT - 1 <= at - wall_start < 40, (rank, at - wall_start)  # its own timeout, not later
    assert g.run(ship(lambda w: "alive")).wait(timeout=30) == ["alive"] * 8


def test_kill_during_channel_put_and_get(cluster, launch):
    ch = Channel.create("f_chan", maxsize=1)
    ch.put("fills the channel")

    def blocked_put(w, ch):
        ch.put("parked item", timeout=60)

    def blocked_get(w, ch):
        return ch.get(key="other", timeout=60)

    host_pid = cluster.session.lookup_group("Channel.f_chan").workers[0].info.pid
    host_before = resources(host_pid)
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]), name="f_chan_workers")
    pids = g.pid().wait()
    putting = run_on(g, 0, blocked_put, ch)
    getting = run_on(g, 1, blocked_get, ch)
    time.sleep(1.0)
    for p in pids:
        os.kill(p, signal.SIGKILL)
    start = time.monotonic()
    for rank, handle in enumerate((putting, getting)):
        with pytest.raises(WorkerDiedError) as info:
            handle.wait(timeout=30)
        assert info.value.rank == rank and info.value.group == "f_chan_workers" and info.value.method == "run"
    assert time.monotonic() - start < 20
    # the surviving host dropped what it held for the dead clients: connections, threads, shared memory
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(resources(host_pid)[k] > host_before[k] + 2 for k in ("fds", "threads")):
        time.sleep(0.2)
    host_after = resources(host_pid)
    assert host_after["fds"] <= host_before["fds"] + 2, (host_before, host_after)
    assert host_after["threads"] <= host_before["threads"] + 2, (host_before, host_after)
    # the channel lives on; the put of the killed producer never returned, so it did not happen: its parked
    # item is dropped with its connection (a producer that retries after an error makes no duplicate)
    assert ch.get(timeout=10) == "fills the channel"
    with pytest.raises(CommTimeoutError):
        ch.get(timeout=1)
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
    # the surviving consumer: PeerDiedError naming the dead host, well before its own 60 s timeout
    assert info.value.exc_type.endswith("PeerDiedError") or "PeerDiedError" in str(info.value)
    assert "f_host" in str(info.value) and info.value.rank == 0 and info.value.group == "f_host_consumer"
    assert time.monotonic() - start < 15
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
