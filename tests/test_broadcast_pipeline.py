"""The pipelined shared-memory fan-out: receivers copy each chunk while the source writes the next.

A source hands its (reused, warm) segment to the receivers on its host before
it writes the payload, and publishes its progress in the segment
(``broadcast_progress``).  These tests check the two guarantees that puts at
risk: a receiver of the next broadcast never takes the previous payload's
bytes as ready, and a source that dies mid-write makes its receivers fail
at once, not wait for bytes that never come.
"""

import mmap
import os
import signal
import struct
import threading
import time

import pytest
import torch

from rlinf.scheduler import CommunicationError, NodePlacementStrategy

from launcher_marks import cpu_transport_internals, survives_worker_death
from p2p_helpers import Peer, ship

GROUP = "bpipe"


@pytest.fixture(scope="module")
def four(cluster):
    """Ranks 0-3 on one host; the last test kills rank 0."""
    g = Peer.create_group().launch(cluster, NodePlacementStrategy([0] * 4), name=GROUP)
    yield g
    g.stop()


def _on(group, ranks, fn, *args):
    return {r: group.execute_on(r).run(ship(fn), *args) for r in ranks}


def _shm_only() -> None:
    os.environ["RLINF_CPU_LOCAL"] = "1"
    os.environ["RLINF_BROADCAST_EAGER_KB"] = "0"


def _alternating(w, rounds: int, mib: int):
    """Broadcasts ``2 * rounds`` payloads of one size (so one warm segment carries them all), payload ``k`` filled
    with ``k + 1``; each receiver checks every byte of every one it got into its ``out=``."""
    _shm_only()
    groups = [(GROUP, [0, 1, 2, 3])]
    per = mib * (1 << 20) // 4 // 4
    if w._rank == 0:
        for k in range(2 * rounds):
            w.broadcast({f"t{i}": torch.full((per,), float(k + 1)) for i in range(4)}, groups=groups, timeout=60)
        return None
    out = {f"t{i}": torch.zeros(per) for i in range(4)}
    wrong = []
    for k in range(2 * rounds):
        w.broadcast(groups=groups, out=out, timeout=60)
        for key, t in out.items():
            bad = int((t != float(k + 1)).sum())
            if bad:
                wrong.append((k, key, bad, sorted({float(v) for v in t.unique()[:4]})))
    return wrong


@cpu_transport_internals
def test_a_reused_segment_never_shows_the_previous_payload_to_the_next_broadcast(four):
    """Payloads A, B, A', B', ... of one size go through one reused segment, handed over before it is written:
    every receiver gets every payload exactly, never a byte of the one before."""
    res = _on(four, [0, 1, 2, 3], _alternating, 3, 32)
    assert res[0].wait(timeout=120)[0] is None
    for r in (1, 2, 3):
        assert res[r].wait(timeout=120)[0] == [], r


def _watch_and_die() -> threading.Thread:
    """A thread that kills this process (SIGKILL) once its next broadcast has written some of its segment but
    not half: it watches the progress word of every broadcast segment this process holds (the warm one the
    previous broadcast of the same size used is reused)."""
    from rlinf.scheduler.messaging.p2p.broadcast_progress import _DONE_BITS, _DONE_MASK, PROGRESS_OFFSET

    words = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if "memfd:rlinf-" in target:
            size = os.fstat(int(name)).st_size
            m = mmap.mmap(int(name), size, mmap.MAP_SHARED, mmap.PROT_READ)
            words.append((m, size, struct.unpack_from("<Q", m, PROGRESS_OFFSET)[0] >> _DONE_BITS))

    def watch():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for m, size, gen in words:
                word = struct.unpack_from("<Q", m, PROGRESS_OFFSET)[0]
                done = word & _DONE_MASK
                if word >> _DONE_BITS != gen and 0 < done < size // 2:
                    os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.0002)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def _source_dies_mid_write(w, mib: int, timeout: float):
    """Rank 0 broadcasts ``mib`` MiB twice to ranks 1 and 2; it dies while writing the second."""
    _shm_only()
    groups = [(GROUP, [0, 1, 2])]
    per = mib * (1 << 20) // 4 // 8
    if w._rank == 0:
        payload = {f"t{i}": torch.full((per,), 1.0) for i in range(8)}
        w.broadcast(payload, groups=groups, timeout=timeout)  # warm: its segment is reused next
        _watch_and_die()
        w.broadcast(payload, groups=groups, timeout=timeout)
        return "the source was not killed"
    out = {f"t{i}": torch.zeros(per) for i in range(8)}
    w.broadcast(groups=groups, out=out, timeout=timeout)
    start = time.monotonic()
    try:
        w.broadcast(groups=groups, out=out, timeout=timeout)
    except CommunicationError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "no error", "", time.monotonic() - start


@survives_worker_death
@cpu_transport_internals
def test_a_source_killed_mid_write_makes_its_receivers_fail_at_once(four):
    """The source's process dies while it writes the payload its receivers are already copying: each receiver
    raises, naming the source, well before its deadline (its link to the source closed), never hanging."""
    timeout = 30.0
    res = _on(four, [0, 1, 2], _source_dies_mid_write, 256, timeout)
    for r in (1, 2):
        kind, text, took = res[r].wait(timeout=timeout + 30)[0]
        assert kind == "PeerDiedError", (r, kind, text)
        assert f"{GROUP}:0" in text, text
        assert took < timeout / 3, (r, took, text)  # at once, not by the deadline
    with pytest.raises(Exception):
        res[0].wait(timeout=30)  # the source's process is gone
