"""Soak: many messages point-to-point and through a channel, small and 1 MiB.

Resident memory of every process involved must grow by less than 50 MiB, and
no file descriptor, thread or shared-memory mapping may leak (shared memory is
``memfd``: it shows as ``memfd:`` lines in ``/proc/<pid>/maps``, never in
``/dev/shm``).

Counts, by default: 50,000 small messages (a leak of 1 KiB per message
fails) and 5,000 of 1 MiB (a leak of 10 KiB per message, 1% of the payload,
fails; descriptors, threads and mappings are counted exactly either way).  ``RLINF_SOAK_ITEMS`` sets both counts: ``hatch run soak`` runs
100,000 of each, the full soak, which moves 100 GB per 1 MiB test and takes
minutes.

The channel soak moves its items over ``STREAMS`` producer threads and as many
consumer threads (one connection per process, shared by its threads, as
programs use a channel): the same items, each put and got once, in under half
the time of a single stream (each put or get waits on its round trip to the
host), and the host sees concurrent clients, where lost or duplicated items
would come from.
"""

import os
import time

import pytest

from rlinf.scheduler import Channel, NodePlacementStrategy

from p2p_helpers import Peer, ship

_ITEMS = os.environ.get("RLINF_SOAK_ITEMS")
#: messages per soak test: small ones, 1 MiB ones
ITEMS = {False: int(_ITEMS or 50_000), True: int(_ITEMS or 5_000)}
WARMUP = 2000
#: producer threads (and as many consumer threads) of the channel soak
STREAMS = 8
MiB = 1 << 20
pytestmark = pytest.mark.timeout(900)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


def _max_segments() -> int:
    return int(os.environ.get("RLINF_SHM_MAX_SEGMENTS", "32"))


def memfd_mappings(pid):
    with open(f"/proc/{pid}/maps") as f:
        return sum("memfd:" in line for line in f)


def snapshot(pids):
    return {p: (rss(p), fds(p), threads(p), memfd_mappings(p)) for p in pids}


def check_growth(before, after, label):
    report = {p: ((after[p][0] - before[p][0]) / MiB, *(a - b for a, b in zip(after[p][1:], before[p][1:]))) for p in before}
    print(f"{label}: growth per process (MiB, fds, threads, memfd mappings): {report}")
    for pid, (mem, fd, thr, memfd) in report.items():
        assert mem < 50, f"{label}: process {pid} grew by {mem:.1f} MiB"
        assert fd <= 2, f"{label}: process {pid} gained {fd} file descriptors"
        assert thr <= 2, f"{label}: process {pid} gained {thr} threads"
        # a link keeps up to RLINF_SHM_MAX_SEGMENTS segments for reuse (mapped by both ends): bounded, not a leak
        assert memfd <= _max_segments() + 2, f"{label}: process {pid} gained {memfd} memfd mappings"
    return report


def _stream(w, n, big):
    import torch

    name = w.worker_group_name
    item = torch.ones(MiB // 4) if big else {"step": 1, "reward": 0.5, "done": False}
    for i in range(n):
        if w._rank == 0:
            w.send(item, name, 1, timeout=120)
            if i % 500 == 499:
                w.recv(name, 1, timeout=120)  # bounded in-flight
        else:
            got = w.recv(name, 0, timeout=120)
            del got
            if i % 500 == 499:
                w.send("ack", name, 0, timeout=120)
    return n


def _in_streams(fn, n, streams):
    """``fn(k)`` in ``streams`` threads at once, the ``k`` summing to ``n``; joined before returning (no thread
    is left to count as a leak); re-raises the first error; returns the sum of what they returned."""
    from concurrent.futures import ThreadPoolExecutor

    counts = [n // streams + (1 if i < n % streams else 0) for i in range(streams)]
    with ThreadPoolExecutor(max_workers=streams) as pool:
        return sum(f.result() for f in [pool.submit(fn, k) for k in counts])


def _produce(w, ch, n, big, streams=1):
    import torch

    item = torch.ones(MiB // 4) if big else {"step": 1, "reward": 0.5, "done": False}

    def put(k):
        for _ in range(k):
            ch.put(item, timeout=120)
        return k

    return _in_streams(put, n, streams)


def _consume(w, ch, n, streams=1):
    def get(k):
        for _ in range(k):
            got = ch.get(timeout=120)
            del got
        return k

    return _in_streams(get, n, streams)


@pytest.mark.parametrize("big", [False, True], ids=["small", "1MiB"])
def test_soak_point_to_point(launch, big):
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]), name=f"soak_p2p_{int(big)}")
    pids = g.pid().wait()
    assert g.run(ship(_stream), WARMUP, big).wait() == [WARMUP] * 2
    before = snapshot(pids)
    start = time.monotonic()
    items = ITEMS[big]
    assert g.run(ship(_stream), items, big).wait(timeout=800) == [items] * 2
    print(f"{items} point-to-point messages ({'1 MiB' if big else 'small'}) in {time.monotonic() - start:.1f} s")
    check_growth(before, snapshot(pids), f"p2p {'1 MiB' if big else 'small'}")


@pytest.mark.parametrize("big", [False, True], ids=["small", "1MiB"])
def test_soak_channel(cluster, launch, big):
    ch = Channel.create(f"soak_{int(big)}", maxsize=256)
    host = cluster.session.lookup_group(f"Channel.soak_{int(big)}").workers[0].info.pid
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]), name=f"soak_ch_{int(big)}")
    pids = g.pid().wait() + [host]

    def round_trip(n):
        p = g.execute_on(0).run(ship(_produce), ch, n, big, STREAMS)
        c = g.execute_on(1).run(ship(_consume), ch, n, STREAMS)
        assert p.wait(timeout=800) == [n] and c.wait(timeout=800) == [n]

    round_trip(WARMUP)
    before = snapshot(pids)
    start = time.monotonic()
    round_trip(ITEMS[big])
    print(f"{ITEMS[big]} channel put/get ({'1 MiB' if big else 'small'}) in {time.monotonic() - start:.1f} s")
    check_growth(before, snapshot(pids), f"channel {'1 MiB' if big else 'small'}")
    assert ch.qsize() == 0
