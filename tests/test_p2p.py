"""Point-to-point communication between workers, on a real local Ray."""

import dataclasses
import os
import signal
import time

import numpy as np
import pytest
import torch

from rlinf.scheduler import (
    Channel,
    CollectiveGroupOptions,
    CommunicationError,
    NodePlacementStrategy,
    PeerDiedError,
    WorkerMethodError,
)

from p2p_helpers import Peer, await_with_ticker, link_to, run_on, ship
from launcher_marks import cpu_transport_internals, survives_worker_death


@pytest.fixture(scope="module")
def pair(cluster):
    """Two groups of two workers each, shared by the tests in this module."""
    a = Peer.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="p2p_a")
    b = Peer.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="p2p_b")
    yield a, b
    a.stop()
    b.stop()


@dataclasses.dataclass
class Rollout:
    obs: torch.Tensor
    info: dict


def _payload():
    return {
        "f32": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "bf16": torch.linspace(0, 1, 7, dtype=torch.bfloat16),
        "i64": torch.tensor([1, -2, 3], dtype=torch.int64),
        "bool": torch.tensor([True, False]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "transposed": torch.arange(6.0).reshape(2, 3).t(),
        "grad": torch.ones(2, requires_grad=True),
        "big": torch.arange(300_000, dtype=torch.float32),  # goes through shared memory
        "tuple": (torch.ones(1), "text", 3),
        "list": [torch.full((2,), float(i)) for i in range(4)],
        "dataclass": Rollout(torch.ones(2, 2), {"reward": torch.tensor([0.5]), "done": False}),
        "numpy": np.arange(10, dtype=np.int16),
        "plain": {"a": [1, 2, {"b": None}], "s": "hello"},
    }


def _check_payload(got):
    want = _payload()
    assert set(got) == set(want)
    for key in ("f32", "bf16", "i64", "bool", "scalar", "empty", "transposed", "big"):
        assert isinstance(got[key], torch.Tensor), key
        assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape, key
        assert torch.equal(got[key], want[key]), key
    assert got["grad"].requires_grad and torch.equal(got["grad"].detach(), want["grad"].detach())
    assert isinstance(got["tuple"], tuple) and got["tuple"][1:] == ("text", 3)
    assert [t.tolist() for t in got["list"]] == [[float(i)] * 2 for i in range(4)]
    assert isinstance(got["dataclass"], Rollout) and torch.equal(got["dataclass"].info["reward"], torch.tensor([0.5]))
    assert got["numpy"].dtype == np.int16 and got["numpy"].tolist() == list(range(10))
    assert got["plain"] == want["plain"]
    return True


def test_objects_and_tensors_keep_types_shapes_dtypes(pair):
    a, b = pair
    recv = run_on(b, 0, lambda w: _check_payload(w.recv("p2p_a", 0)))
    run_on(a, 0, lambda w: w.send(_payload(), "p2p_b", 0)).wait()
    assert recv.wait() == [True]


def test_tensors_are_not_pickled():
    from rlinf.scheduler.transports import codec

    header, buffers = codec.encode({"t": torch.ones(1000), "l": [torch.zeros(10)]})
    assert len(header) < 400 and sorted(memoryview(b).nbytes for b in buffers) == [40, 4000]


def test_send_tensor_fills_in_place(pair):
    a, b = pair

    def receiver(w):
        buf = torch.zeros(1000, 3)
        ptr = buf.data_ptr()
        w.recv_tensor(buf, "p2p_a", 1)
        small = torch.zeros(5, dtype=torch.int32)
        w.recv_tensor(small, "p2p_a", 1)
        return buf.data_ptr() == ptr, float(buf.sum()), small.tolist()

    r = run_on(b, 1, receiver)
    run_on(a, 1, lambda w: (w.send_tensor(torch.ones(1000, 3), "p2p_b", 1),
                            w.send_tensor(torch.arange(5, dtype=torch.int32), "p2p_b", 1))).wait()
    assert r.wait() == [(True, 3000.0, [0, 1, 2, 3, 4])]


def test_recv_tensor_mismatch_is_a_clear_error_and_the_pair_survives(pair):
    a, b = pair

    def receiver(w):
        errors = []
        for buf in (torch.zeros(4), torch.zeros(3, dtype=torch.int32)):  # wrong shape, then wrong dtype
            try:
                w.recv_tensor(buf, "p2p_a", 0)
            except CommunicationError as exc:
                errors.append(str(exc))
        good = torch.zeros(3)
        w.recv_tensor(good, "p2p_a", 0)
        return errors, good.tolist()

    r = run_on(b, 0, receiver)
    run_on(a, 0, lambda w: [w.send_tensor(torch.ones(3), "p2p_b", 0) for _ in range(3)]).wait()
    (errors, good), = r.wait()
    assert len(errors) == 2 and "does not match" in errors[0] and "dtype or shape" in errors[1]
    assert good == [1.0, 1.0, 1.0]


def test_non_contiguous_send_tensor_is_refused(pair):
    a, _ = pair
    with pytest.raises(WorkerMethodError, match="contiguous"):
        run_on(a, 0, lambda w: w.send_tensor(torch.ones(3, 4).t(), "p2p_b", 0)).wait()


def test_unpicklable_object_fails_on_both_ends_at_once(pair):
    a, b = pair

    def receiver(w):
        start = time.monotonic()
        try:
            w.recv("p2p_a", 1, timeout=60)
        except CommunicationError as exc:
            return str(exc), time.monotonic() - start
        return None

    r = run_on(b, 1, receiver)

    def sender(w):
        import threading

        try:
            w.send({"lock": threading.Lock()}, "p2p_b", 1)
        except TypeError as exc:
            return str(exc)

    assert "cannot send" in run_on(a, 1, sender).wait()[0]
    (text, waited), = r.wait()
    assert "failed to serialize" in text and waited < 30


def test_unknown_group_and_rank(pair, cluster):
    a, _ = pair
    Channel.create("p2p_listed", cluster=cluster)
    with pytest.raises(WorkerMethodError, match="no group named 'nosuchgroup'") as info:
        run_on(a, 0, lambda w: w.send(1, "nosuchgroup", 0)).wait()
    # the user's groups, then the channels by their names: a channel's host is no group of the user's
    text = str(info.value)
    assert "channels [" in text and "'p2p_listed'" in text and "Channel.p2p_listed" not in text, text
    with pytest.raises(WorkerMethodError, match="rank 7 is out of range for group 'p2p_b' of 2"):
        run_on(a, 0, lambda w: w.recv("p2p_b", 7)).wait()


def test_recv_timeout_names_the_peer(pair):
    _, b = pair
    start = time.monotonic()
    with pytest.raises(WorkerMethodError, match=r"CommTimeoutError.*'p2p_a:1'.*timed out after 0.5 s"):
        run_on(b, 0, lambda w: w.recv("p2p_a", 1, timeout=0.5)).wait()
    assert time.monotonic() - start < 10


def test_order_async_and_both_directions(pair):
    a, b = pair

    def side(w, me, other, n):
        works = [w.send((me, i, torch.full((1000,), i)), other, 0, async_op=True) for i in range(n)]
        got = [w.recv(other, 0) for _ in range(n // 2)]
        pending = [w.recv(other, 0, async_op=True) for _ in range(n - n // 2)]
        got += [p.wait() for p in pending]
        for wk in works:
            wk.wait()
        return [(g[0], g[1], int(g[2][0])) for g in got] == [(other, i, i) for i in range(n)]

    ra = run_on(a, 0, side, "p2p_a", "p2p_b", 200)
    rb = run_on(b, 0, side, "p2p_b", "p2p_a", 200)
    assert ra.wait() == [True] and rb.wait() == [True]


def test_big_tensors_both_directions_sync_send_first(pair):
    a, b = pair

    def side(w, other):
        t = torch.full((4 << 20,), float(w._rank + 1))  # 16 MiB
        w.send(t, other, 1)
        got = w.recv(other, 1)
        return float(got.mean())

    ra = run_on(a, 1, side, "p2p_b")
    rb = run_on(b, 1, side, "p2p_a")
    assert ra.wait() == [2.0] and rb.wait() == [2.0]


def test_group_with_itself_and_all_pairs(cluster, launch):
    g = launch(Peer, placement=NodePlacementStrategy([0, 0, 0]), name="ring")

    def all_to_all(w):
        name = w.worker_group_name
        for dst in range(w._world_size):
            w.send((w._rank, dst), name, dst, async_op=True)
        return sorted(w.recv(name, src) for src in range(w._world_size))

    results = g.run(ship(all_to_all)).wait()
    assert results == [[(s, d) for s in range(3)] for d in range(3)]


def test_async_work_api(pair):
    a, b = pair

    def receiver(w):
        work = w.recv("p2p_a", 0, async_op=True)
        chained = work.then(lambda obj: obj["x"] * 2)
        w.send("ready", "p2p_a", 0)  # the sender waits 1.5 s from here: the await below has begun by then
        value, ticks = await_with_ticker(work)
        return value["x"], chained.wait(5), work.done(), ticks

    def sender(w):
        assert w.recv("p2p_b", 0) == "ready"
        time.sleep(1.5)
        w.send({"x": 21}, "p2p_b", 0)

    r = run_on(b, 0, receiver)
    run_on(a, 0, sender).wait(timeout=60)
    (x, doubled, done, ticks), = r.wait()
    # the loop kept running while waiting: a blocked loop ticks at most once in the 1.5 s a 10 ms ticker fills ~150 times
    assert (x, doubled, done) == (21, 42, True) and ticks >= 5, ticks


def test_wait_reraises_the_operations_own_timeout_not_a_timeout_of_its_own():
    """An async operation that failed with its own timeout (``CommTimeoutError``, which names the
    peer) is re-raised by ``wait()`` as it is: before, ``wait()`` took it for its own timeout and
    said "not finished after None s", losing the peer and the cause."""
    import concurrent.futures

    from rlinf.scheduler.base.errors import CommTimeoutError
    from rlinf.scheduler.transports.async_work import AsyncWork

    failed = concurrent.futures.Future()
    failed.set_exception(CommTimeoutError("g:0: sending to worker 'h:1' timed out after 5 s", peer="h:1"))
    with pytest.raises(CommTimeoutError, match="h:1"):
        AsyncWork(failed, "sending to 'h:1'").wait()
    pending = AsyncWork(concurrent.futures.Future(), "sending to 'h:1'")
    with pytest.raises(TimeoutError, match="not finished after 0.1 s"):
        pending.wait(0.1)


def test_transport_selection(launch):
    """An explicit transport is used for that pair (own groups: a pair keeps the transport it started with)."""
    a = launch(Peer, placement=NodePlacementStrategy([0]), name="sel_a")
    b = launch(Peer, placement=NodePlacementStrategy([0, 0]), name="sel_b")
    opts = CollectiveGroupOptions(transport="cpu")
    r = run_on(b, 1, lambda w, o: w.recv("sel_a", 0, options=o), opts)
    run_on(a, 0, lambda w, o: w.send("via cpu", "sel_b", 1, options=o), opts).wait()
    assert r.wait() == ["via cpu"]
    with pytest.raises(WorkerMethodError, match="no transport named 'nosuch'"):
        run_on(a, 0, lambda w: w.send(1, "sel_b", 1, options=CollectiveGroupOptions(transport="nosuch"))).wait()
    with pytest.raises(ValueError):
        CollectiveGroupOptions(transport="")


@cpu_transport_internals
def test_network_path_without_shared_memory(cluster, launch):
    """Peers on different hosts use TCP: forced here with RLINF_CPU_LOCAL=0."""
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]), name="tcp_pair")

    def exchange(w):
        os.environ["RLINF_CPU_LOCAL"] = "0"
        name = w.worker_group_name
        if w._rank == 0:
            w.send({"t": torch.arange(3_000_000, dtype=torch.float32), "s": "x"}, name, 1)
            buf = torch.zeros(1 << 20)
            w.recv_tensor(buf, name, 1)
            return float(buf.sum())
        got = w.recv(name, 0)
        w.send_tensor(torch.ones(1 << 20), name, 0)
        link = link_to(f"{name}:0", incoming=True)
        return bool(torch.equal(got["t"], torch.arange(3_000_000, dtype=torch.float32))), link.local

    assert g.run(ship(exchange)).wait() == [float(1 << 20), (True, False)]


@cpu_transport_internals
def test_shared_memory_is_reused_and_not_leaked(cluster, launch):
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]), name="shm_pair")

    def loop(w, n):
        name = w.worker_group_name
        for i in range(n):  # lockstep, so at most a couple of segments are ever in flight
            if w._rank == 0:
                w.send(torch.full((2 << 20,), float(i)), name, 1)
                w.recv(name, 1)
            else:
                t = w.recv(name, 0)
                assert float(t[0]) == i
                del t
                w.send("ack", name, 0)
        if w._rank == 0:
            link = link_to(f"{name}:1")
            return len(link._pool._segments)
        return len(os.listdir(f"/proc/{os.getpid()}/fd"))

    segments, fds = g.run(ship(loop), 50).wait()
    assert segments <= 3  # freed segments are reused, not reallocated per message
    assert fds < 200
    # shared memory is memfd (never in /dev/shm): count the mappings each process holds, from /proc
    maps = g.run(ship(lambda w: sum("memfd:" in line for line in open("/proc/self/maps")))).wait()
    assert maps[0] <= 3 and maps[1] <= 3, maps


def _memfd_bytes(pid) -> int:
    """Bytes of rlinf shared-memory segments mapped by ``pid``, read from /proc (independent of rlinf)."""
    total = 0
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "memfd:rlinf" in line:
                lo, hi = line.split()[0].split("-")
                total += int(hi, 16) - int(lo, 16)
    return total


@cpu_transport_internals
def test_receiver_keeping_everything_never_stalls_its_sender(cluster, launch):
    """Past RLINF_SHM_POOL_MB held by the receiver, buffers go inline: every send completes, the
    sender's shared memory stays within the pool, and every kept tensor still holds what was sent."""
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]), name="shm_bound")

    def run(w):
        os.environ["RLINF_SHM_POOL_MB"] = "16"
        name = w.worker_group_name
        if w._rank == 0:
            for i in range(20):
                w.send(torch.full((1 << 20,), float(i)), name, 1, timeout=20)  # 4 MiB each
            w.recv(name, 1, timeout=30)
            return _memfd_bytes(os.getpid())
        kept = [w.recv(name, 0, timeout=30) for _ in range(20)]  # all kept alive
        w.send("done", name, 0)
        return [float(t[0]) for t in kept] + [float(t[-1]) for t in kept]

    mapped, values = g.run(ship(run)).wait(timeout=120)
    assert values == [float(i) for i in range(20)] * 2
    assert 0 < mapped <= (16 << 20) + 20 * 4096, mapped  # segments plus their state pages


def test_broadcast_across_groups(pair):
    a, b = pair
    groups = [("p2p_a", [0, 1]), ("p2p_b", [0, 1])]
    fn = lambda w, g: w.broadcast({"w": torch.ones(3)} if (w.worker_group_name, w._rank) == ("p2p_a", 0) else None,
                                  groups=g, src=("p2p_a", 0))["w"].sum().item()
    ra, rb = a.run(ship(fn), groups), b.run(ship(fn), groups)
    assert ra.wait() == [3.0, 3.0] and rb.wait() == [3.0, 3.0]


class Nest(Peer):
    def spawn(self):
        from rlinf.scheduler import Cluster

        self.children = Peer.create_group().launch(Cluster(), placement_strategy=NodePlacementStrategy([0, 0]))
        return [i.address.get_name() for i in self.children.worker_info_list]

    def children_run(self, payload, *args):
        return self.children.run(payload, *args).wait()


def test_nested_workers_by_rank_path(launch):
    from p2p_helpers import ship

    parents = launch(Nest, placement=NodePlacementStrategy([0]), name="nestp")
    assert parents.spawn().wait() == [["nestp:0:0", "nestp:0:1"]]

    def child(w):
        if w._rank == 0:
            w.send("to sibling", "nestp", [0, 1])
            w.send("to parent", "nestp", 0)
            return w.recv("nestp:0", 1)
        got = w.recv("nestp", [0, 0])
        w.send("back", "nestp:0", 0)
        return got

    kids = parents.children_run(ship(child))
    parent_got = run_on(parents, 0, lambda w: w.recv("nestp", [0, 0])).wait()
    assert kids.wait() == [["back", "to sibling"]]
    assert parent_got == ["to parent"]


@survives_worker_death
def test_peer_death_unblocks_recv(cluster, launch):
    g = launch(Peer, placement=NodePlacementStrategy([0, 0, 0]), name="dying")
    pids = g.pid().wait()

    def waiter(w, src):
        start = time.monotonic()
        try:
            if src == 1:  # connected first, then the peer dies
                w.recv("dying", 1, timeout=120)
            w.recv("dying", src, timeout=120)
        except PeerDiedError as exc:
            return "PeerDiedError", str(exc), time.monotonic() - start
        except Exception as exc:
            return type(exc).__name__, str(exc), time.monotonic() - start

    run_on(g, 1, lambda w: w.send("hello", "dying", 0)).wait()
    r1 = run_on(g, 0, waiter, 1)
    time.sleep(1.0)
    os.kill(pids[1], signal.SIGKILL)
    kind, text, waited = r1.wait()[0]
    assert kind == "PeerDiedError" and "'dying:1'" in text and waited < 15
    # a peer that never connected, then died
    r2 = run_on(g, 0, waiter, 2)
    time.sleep(1.0)
    os.kill(pids[2], signal.SIGKILL)
    kind, text, waited = r2.wait()[0]
    assert kind == "PeerDiedError" and "'dying:2'" in text and waited < 15


def test_network_path_both_directions_large_sync_sends(cluster, launch):
    """Over TCP, both workers send 64 MiB before receiving: read-ahead keeps this from deadlocking."""
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]), name="tcp_both")

    def both(w):
        os.environ["RLINF_CPU_LOCAL"] = "0"
        name, other = w.worker_group_name, 1 - w._rank
        w.send(torch.full((16 << 20,), float(w._rank)), name, other, timeout=60)
        got = w.recv(name, other, timeout=60)
        buf = torch.zeros(4)
        w.send_tensor(torch.full((4,), 7.0), name, other)
        w.recv_tensor(buf, name, other)
        return float(got[0]), float(got.sum()) / got.numel(), buf.tolist()

    assert g.run(ship(both)).wait() == [(1.0, 1.0, [7.0] * 4), (0.0, 0.0, [7.0] * 4)]


def test_a_busy_worker_still_takes_messages(pair):
    """Messages to a worker that is busy in a long method are accepted at once and delivered later."""
    a, b = pair

    def busy_then_read(w):
        time.sleep(5)
        woke = time.time()
        return woke, [w.recv("p2p_a", 1, timeout=30) for _ in range(20)]

    def send_all(w):
        for i in range(20):
            w.send(i, "p2p_b", 0)
        return time.time()

    busy = run_on(b, 0, busy_then_read)
    time.sleep(0.3)
    sent = run_on(a, 1, send_all).wait(timeout=30)[0]
    (woke, got), = busy.wait(timeout=30)
    assert got == list(range(20))
    assert sent < woke, "the sender waited for the busy receiver"  # same host: one clock


def test_send_tensor_and_recv_tensor_with_async_op(pair):
    """``async_op=True`` returns AsyncWork at once on both sides; the data lands in the receiver's buffer."""
    a, b = pair

    def sender(w):
        from rlinf.scheduler.transports.async_work import AsyncWork

        t = torch.arange(1 << 18, dtype=torch.float32)  # 1 MiB: the shared-memory path
        small = torch.full((4,), 3.0)
        works = [w.send_tensor(t, "p2p_b", 0, async_op=True), w.send_tensor(small, "p2p_b", 0, async_op=True)]
        assert all(isinstance(x, AsyncWork) for x in works)
        return [x.wait(timeout=60) for x in works]

    def receiver(w):
        big, small = torch.zeros(1 << 18), torch.zeros(4)
        first = w.recv_tensor(big, "p2p_a", 0, async_op=True)
        second = w.recv_tensor(small, "p2p_a", 0, async_op=True)
        value, ticks = await_with_ticker(first)
        second.wait(timeout=60)
        return bool(torch.equal(big, torch.arange(1 << 18, dtype=torch.float32))), small.tolist(), first.done()

    got = run_on(b, 0, receiver)
    sent = run_on(a, 0, sender).wait(timeout=60)[0]
    assert sent == [None, None]
    assert got.wait(timeout=60) == [(True, [3.0] * 4, True)]


def test_async_send_tensor_to_a_missing_group_reports_it(pair):
    a, _ = pair

    def body(w):
        try:
            w.send_tensor(torch.ones(4), "nosuchgroup_async", 0, async_op=True).wait(timeout=30)
        except Exception as exc:  # refused, not lost: the error reaches the caller, at the call or its wait
            return type(exc).__name__, str(exc)
        return "no error", ""

    kind, text = run_on(a, 0, body).wait(timeout=60)[0]
    assert kind == "CommunicationError" and "nosuchgroup_async" in text, (kind, text)
