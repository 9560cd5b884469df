"""What one worker costs as a group grows: launch time, memory, threads, descriptors, connects, registry, broadcast.

    python benchmarks/footprint.py [--sizes 2,8,16,32] [--bcast-mb 16]

Prints the numbers ``docs/architecture.md`` ("Scaling to 1,000+ workers")
quotes.  Everything runs on one Ray node (a local one, or node 0 of the
cluster ``RAY_ADDRESS`` names); set ``RLINF_CPU_LOCAL=0`` in the environment
to force TCP between the workers as between hosts.  Not a
CI benchmark: it has no raw baseline, only per-N costs (with a plain
single send as the yardstick for broadcast), and it takes minutes.
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import threading
import time

import psutil
import torch
from common import close_cluster, local_cluster

from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker


class Probe(Worker):
    def usage(self):
        p = psutil.Process()
        mem = p.memory_full_info()
        return {"rss": mem.rss, "uss": mem.uss, "threads": threading.active_count(), "os_threads": p.num_threads(),
                "fds": p.num_fds()}

    def connect_to(self, dst):
        """Seconds of the first send to ``dst`` (registry lookup + connect + handshake) and of a second one."""
        name = self.worker_group_name
        t0 = time.perf_counter()
        self.send(0, name, dst)
        t1 = time.perf_counter()
        self.send(1, name, dst)
        return t1 - t0, time.perf_counter() - t1

    def drain(self, srcs):
        name = self.worker_group_name
        for s in srcs:
            self.recv(name, s)
            self.recv(name, s)

    def lookups(self, n):
        from rlinf.scheduler.runtime.cluster import current_session

        session = current_session()
        record = session.lookup_group(self.worker_group_name)
        times = []
        for _ in range(n):
            t = time.perf_counter()
            session.lookup_group(self.worker_group_name)
            times.append(time.perf_counter() - t)
        return statistics.median(times), len(pickle.dumps(record))

    def bcast(self, nbytes, members, reps):
        name = self.worker_group_name
        obj = torch.ones(nbytes // 4) if self._rank == 0 else None
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            self.broadcast(obj, groups=[(name, members)], src=(name, 0))
            times.append(time.perf_counter() - t)
        return min(times)

    def single(self, nbytes, reps):
        """One plain send of the same payload from rank 0 to rank 1: the yardstick for broadcast."""
        name = self.worker_group_name
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            if self._rank == 0:
                self.send(torch.ones(nbytes // 4), name, 1)
                self.recv(name, 1)
            else:
                self.recv(name, 0)
                self.send(None, name, 0)
            times.append(time.perf_counter() - t)
        return min(times)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="2,8,16,32")
    parser.add_argument("--bcast-mb", type=int, default=16)
    args = parser.parse_args(argv)
    # RAY_ADDRESS: measure on that cluster (started with `ray start`), else on a local one
    cluster = Cluster(log_to_driver=False) if os.environ.get("RAY_ADDRESS") else local_cluster()
    route = "tcp" if os.environ.get("RLINF_CPU_LOCAL") == "0" else "unix+shm"
    print(f"route between workers: {route}")
    print("floor: n/a (these are costs per worker, which no raw program has; the broadcast's yardstick is "
          "one plain send of the same payload, measured in the same run)")
    try:
        for n in [int(x) for x in args.sizes.split(",")]:
            t = time.perf_counter()
            group = Probe.create_group().launch(cluster, NodePlacementStrategy([0] * n), name=f"fp{n}")
            group.usage().wait()
            launch = time.perf_counter() - t
            idle = group.usage().wait()
            # every rank > 0 connects to rank 0: rank 0 ends up with n-1 incoming links
            drain = group.execute_on(0).drain(list(range(1, n)))
            conn = group.execute_on(*range(1, n)).connect_to(0).wait()
            drain.wait()
            hub = group.execute_on(0).usage().wait()[0]
            lookup, record_bytes = group.execute_on(0).lookups(20).wait()[0]
            nbytes = args.bcast_mb << 20
            group.execute_on(0, 1).single(nbytes, 1).wait()  # warm the pair
            single = group.execute_on(0, 1).single(nbytes, 3).wait()[0]
            group.bcast(nbytes, list(range(n)), 1).wait()  # every link made
            bcast = group.bcast(nbytes, list(range(n)), 3).wait()[0]
            mb = 1 << 20
            print(
                f"N={n:3d} launch {launch:6.2f} s ({launch / n * 1000:5.0f} ms/worker) | idle worker: "
                f"RSS {statistics.median(u['rss'] for u in idle) / mb:5.0f} MiB, USS {statistics.median(u['uss'] for u in idle) / mb:4.0f} MiB, "
                f"{statistics.median(u['os_threads'] for u in idle):.0f} threads, {statistics.median(u['fds'] for u in idle):.0f} fds | "
                f"hub with {n - 1} links: {hub['os_threads']} threads, {hub['fds']} fds | first send "
                f"{statistics.median(c[0] for c in conn) * 1000:5.1f} ms, next {statistics.median(c[1] for c in conn) * 1000:5.2f} ms | "
                f"registry lookup {lookup * 1000:4.1f} ms, record {record_bytes} B | broadcast {args.bcast_mb} MiB to {n - 1}: "
                f"{bcast * 1000:6.1f} ms = {bcast / single:4.1f}x one send",
                flush=True,
            )
            group.stop()
    finally:
        cluster.shutdown() if os.environ.get("RAY_ADDRESS") else close_cluster(cluster)


if __name__ == "__main__":
    main()
