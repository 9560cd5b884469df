"""A worker that only receives lets go of a dead sender's shared memory.

Same-host buffers travel in the sender's ``memfd`` segments, which the
receiving side keeps mapped for reuse while the link lives.  When the sender
is SIGKILLed its link ends, and every process that holds links (not only those
that send) sweeps the links of peers that went away within its housekeeping
interval: the segments are unmapped and the kernel frees the memory.
"""

import os
import signal
import time

from rlinf.scheduler import NodePlacementStrategy

from launcher_marks import cpu_transport_internals, survives_worker_death
from p2p_helpers import Peer, process_alive, run_on

SIZE = 64 << 20
#: seconds the receiver may take to unmap a dead sender's segments (its sweep runs every second;
#: the rest is slack for a loaded machine)
SWEPT_WITHIN = 10.0


def _memfd_bytes(pid: int) -> int:
    """Bytes of rlinf shared-memory segments process ``pid`` maps now, read from ``/proc/<pid>/maps``."""
    total = 0
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            if "/memfd:rlinf-" in line:
                lo, hi = line.split()[0].split("-")
                total += int(hi, 16) - int(lo, 16)
    return total


@survives_worker_death
@cpu_transport_internals
def test_a_receive_only_worker_unmaps_a_killed_senders_segments(cluster, launch):
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]))
    sender, receiver = g.pid().wait(timeout=60)
    assert sender != receiver

    def receive(w, name):
        return int(w.recv(name, 0, timeout=60).nbytes)  # the array is dropped: only the link keeps the segment

    def send(w, name):
        import numpy as np

        w.send(np.ones(SIZE, dtype=np.uint8), name, 1, timeout=60)

    got = run_on(g, 1, receive, g.worker_group_name)
    run_on(g, 0, send, g.worker_group_name).wait(timeout=60)
    assert got.wait(timeout=60) == [SIZE]
    assert _memfd_bytes(receiver) >= SIZE  # the segment went through shared memory and is kept for reuse
    os.kill(sender, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process_alive(sender) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(sender)
    killed = time.monotonic()
    while _memfd_bytes(receiver) and time.monotonic() - killed < SWEPT_WITHIN:
        time.sleep(0.1)
    left = _memfd_bytes(receiver)
    print(f"unmapped {time.monotonic() - killed:.2f} s after the sender's death")
    assert left == 0, f"{left} bytes of the dead sender's segments still mapped {SWEPT_WITHIN} s after its death"
