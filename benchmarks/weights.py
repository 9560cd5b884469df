"""Weight sync: one trainer broadcasts a state dict to N rollout workers on this host, same run.

    hatch run bench weights [--size-mb 512] [--tensors 64] [--ns 1,2,4,8] [--rounds 3]

* rlinf shm: ``broadcast(state_dict)`` on the trainer, ``broadcast(out=own_state_dict)``
  on each receiver (filled in place); the payload is written once into shared memory.
* rlinf shm shared: the same with ``share_memory=True`` on the receivers: the memory behind
  their state dicts' tensors moves onto the segment the source wrote (same tensor objects;
  the source alternates between two segments, never writing one a receiver is on); no
  receiver copies anything.
* rlinf TCP: the same with ``RLINF_CPU_LOCAL=0`` (a chunked, pipelined chain).
* rlinf shm views: ``broadcast(groups=...)`` without ``out=``: receivers get copy-on-write
  views of the segment (no copy; the like of Ray's zero-copy reads), kept until the next round.
* Ray object store: ``ray.put`` of the state dict as numpy arrays once, ``ray.get`` in
  every receiver (zero-copy reads on one node: the receivers touch nothing).
* torch gloo: ``dist.broadcast`` of every tensor (asynchronously, then waited for) in a
  gloo process group of N+1 processes, into the receivers' existing tensors.
* copy floor (raw, not a target): N plain processes each copy the payload from one warm
  shared mapping into their own warm state dict (``--tensors`` torch tensors, as a
  receiver's), all at once: what N in-place receptions cost this machine's cores and
  memory at the least, with no protocol at all.  Receiving in place cannot beat it, and
  with fewer cores than receivers it grows with N.  "one buffer" is the same into a single
  buffer: one large ``memcpy``, which glibc does with non-temporal stores past a size set
  by the CPU's cache (see ``ld.so --list-diagnostics``, ``non_temporal_threshold``);
  a state dict's tensors are each below it on most machines, and each copy then reads
  its destination in before writing it.
* TCP floor (raw, not a target): N plain sender processes each stream the payload over
  loopback TCP to one of N plain receiver processes, all at once: the socket work any
  broadcast forced over TCP must do on one host (a send and a receive copy per receiver).

Times run from the trainer's call until every receiver has the weights (rlinf's
source returns once all have acknowledged; gloo and Ray end with a barrier / the
receivers' replies).  Median of ``--rounds`` after one warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import Target, add_run_options, close_cluster, local_cluster, parse, print_table, save_plot

import plots

from rlinf.scheduler import NodePlacementStrategy, Worker

MiB = 1 << 20
NAME = "bench_weights"


def torch_zeros_like(t):
    import torch

    return torch.zeros_like(t)


def _state_dict(size_mb: int, tensors: int, fill: float):
    import torch

    per = max(1, size_mb * MiB // tensors // 4)
    return {f"layer{i}.weight": torch.full((per,), fill + i) for i in range(tensors)}


class WeightWorker(Worker):
    """Rank 0 is the trainer; ranks 1..N the rollout workers."""

    def __init__(self, size_mb: int, tensors: int):
        super().__init__()
        self.sd = _state_dict(size_mb, tensors, 1.0 if self._rank == 0 else 0.0)
        self.subgroups = {}

    def rlinf_sync(self, n: int, rounds: int, tcp: bool, views: bool = False, share: bool = False):
        os.environ["RLINF_CPU_LOCAL"] = "0" if tcp else "1"
        if self._rank > n:
            return None
        sd = self.sd
        if share and self._rank:  # a state dict of its own, so the other variants keep private memory
            if not hasattr(self, "shared_sd"):
                self.shared_sd = {k: torch_zeros_like(v) for k, v in self.sd.items()}
            sd = self.shared_sd
        groups = [(NAME, list(range(n + 1)))]
        times = []
        kept = None
        for i in range(rounds + 1):
            start = time.perf_counter()
            if self._rank == 0:
                self.broadcast(self.sd, groups=groups, timeout=600)
            elif views:
                kept = self.broadcast(groups=groups, timeout=600)  # replaces the previous round's views
            else:
                self.broadcast(groups=groups, out=sd, timeout=600, share_memory=share)
            times.append(time.perf_counter() - start)
        if kept is not None:
            first = next(iter(kept.values()))
            assert float(first[0]) == 1.0 and float(first[-1]) == 1.0, "the weights did not arrive"
            return statistics.median(times[1:])
        if self._rank:
            first = next(iter(sd.values()))
            assert float(first[0]) == 1.0 and float(first[-1]) == 1.0, "the weights did not arrive"
        return statistics.median(times[1:])

    def init_gloo(self, ns):
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        for n in ns:  # every rank takes part in creating every subgroup
            self.subgroups[n] = dist.new_group(list(range(n + 1)))
        return True

    def gloo_sync(self, n: int, rounds: int):
        import torch.distributed as dist

        if self._rank > n:
            return None
        group = self.subgroups[n]
        times = []
        for _ in range(rounds + 1):
            start = time.perf_counter()
            works = [dist.broadcast(t, 0, group=group, async_op=True) for t in self.sd.values()]
            for w in works:
                w.wait()
            dist.barrier(group=group)
            times.append(time.perf_counter() - start)
        return statistics.median(times[1:])

    def memory_mb(self):
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("VmRSS")).split()[1]) // 1024


class RayReceiver:
    def get(self, refs):
        import ray

        arrays = ray.get(refs[0])  # zero-copy views into the object store
        return len(arrays)


class RaySource:
    def __init__(self, size_mb: int, tensors: int):
        self.arrays = {k: v.numpy() for k, v in _state_dict(size_mb, tensors, 1.0).items()}

    def sync(self, receivers, rounds: int):
        import ray

        times = []
        for _ in range(rounds + 1):
            start = time.perf_counter()
            ref = ray.put(self.arrays)
            ray.get([r.get.remote([ref]) for r in receivers])
            times.append(time.perf_counter() - start)
            del ref
        return statistics.median(times[1:])


def _copy_child(fd: int, size: int, tensors: int, start, done) -> None:
    import mmap

    import numpy as np

    src = np.frombuffer(mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ), dtype=np.uint8)
    if tensors > 1:  # as a receiver's state dict
        dsts = [t.numpy().view(np.uint8) for t in _state_dict(size // MiB, tensors, 0.0).values()]
    else:
        dsts = [np.empty(size, dtype=np.uint8)]

    def copy():
        pos = 0
        for d in dsts:
            np.copyto(d, src[pos : pos + d.nbytes])
            pos += d.nbytes

    copy()  # warm: both mappings faulted in, as a receiver's kept mapping and state dict are
    for _ in range(2):
        start.wait(120)
        copy()
        done.wait(120)


def _timed_rounds(procs: list, start, done, rounds: int = 2) -> list:
    """Start ``procs``; time each of ``rounds`` rounds from the ``start`` barrier to the ``done`` one (every
    wait bounded: a process that fails breaks the barriers within 120 s); join them."""
    for p in procs:
        p.start()
    times = []
    for _ in range(rounds):
        start.wait(120)
        t0 = time.perf_counter()
        done.wait(120)
        times.append(time.perf_counter() - t0)
    for p in procs:
        p.join(60)
    return times


def copy_floor(size_mb: int, n: int, tensors: int = 1) -> float:
    """Seconds for ``n`` processes to copy ``size_mb`` MiB each out of one shared segment at once, into
    ``tensors`` tensors each (median of 2)."""
    import multiprocessing as mp

    import numpy as np

    size = size_mb * MiB
    fd = os.memfd_create("bench-copy-floor")
    try:
        os.ftruncate(fd, size)
        with open(f"/proc/self/fd/{fd}", "r+b", buffering=0) as f:
            f.write(np.ones(size, dtype=np.uint8).tobytes())
        ctx = mp.get_context("fork")
        start, done = ctx.Barrier(n + 1), ctx.Barrier(n + 1)
        procs = [ctx.Process(target=_copy_child, args=(fd, size, tensors, start, done), daemon=True)
                 for _ in range(n)]
        return statistics.median(_timed_rounds(procs, start, done))
    finally:
        os.close(fd)


def _tcp_receiver(listener, size: int, start, done) -> None:
    import numpy as np

    conn, _ = listener.accept()
    arr = np.empty(size, dtype=np.uint8)
    arr.fill(0)  # warm, as a receiver's existing state dict is
    buf = memoryview(arr)
    for _ in range(2):
        start.wait(120)
        pos = 0
        while pos < size:
            got = conn.recv_into(buf[pos:], size - pos)
            if not got:
                raise ConnectionError("sender closed early")
            pos += got
        done.wait(120)


def _tcp_sender(port: int, size: int, start, done) -> None:
    import socket

    import numpy as np

    payload = memoryview(np.ones(size, dtype=np.uint8))
    sock = socket.create_connection(("127.0.0.1", port))
    for _ in range(2):
        start.wait(120)
        sock.sendall(payload)
        done.wait(120)
    sock.close()


def tcp_floor(size_mb: int, n: int) -> float:
    """Seconds for ``n`` sender processes to stream ``size_mb`` MiB each to ``n`` receivers over loopback TCP at once
    (the second of two rounds: the receivers' buffers are warm then)."""
    import multiprocessing as mp
    import socket

    size = size_mb * MiB
    ctx = mp.get_context("fork")
    start, done = ctx.Barrier(2 * n + 1), ctx.Barrier(2 * n + 1)
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    procs = [ctx.Process(target=_tcp_receiver, args=(lst, size, start, done), daemon=True) for lst in listeners]
    procs += [ctx.Process(target=_tcp_sender, args=(lst.getsockname()[1], size, start, done), daemon=True)
              for lst in listeners]
    times = _timed_rounds(procs, start, done)
    for lst in listeners:
        lst.close()
    return times[-1]


def save_line_plot(name: str, title: str, ns: list, series: dict, ylabel: str) -> str:
    """One panel of lines over the receiver count ``ns``; ``ylabel`` names the unit (see ``common.save_plot``)."""
    styles = {k: "s:" for k in series if "floor" in k or "one transfer" in k}  # the raw baselines, dotted
    return save_plot(name, title, plots.line(ns, series, ylabel, "receivers (N)", styles=styles))


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=512, help="state dict size in MiB")
    parser.add_argument("--tensors", type=int, default=64)
    parser.add_argument("--ns", default="1,2,4,8", help="receiver counts")
    parser.add_argument("--rounds", type=int, default=3)
    add_run_options(parser, size_mb=8, tensors=4, ns="1,2", rounds=1)
    args = parse(parser, argv)
    ns = [int(n) for n in args.ns.split(",")]
    top = max(ns)

    import ray

    cluster = local_cluster()
    group = WeightWorker.create_group(args.size_mb, args.tensors).launch(
        cluster, NodePlacementStrategy([0] * (top + 1)), name=NAME)
    group.init_gloo(ns).wait()
    source = ray.remote(num_cpus=0.01)(RaySource).remote(args.size_mb, args.tensors)
    receivers = [ray.remote(num_cpus=0.01)(RayReceiver).remote() for _ in range(top)]

    results = {k: {} for k in ("rlinf shm", "rlinf TCP", "Ray object store", "torch gloo", "rlinf shm views",
                               "rlinf shm shared")}
    floor, floor_one, tcp_fl = {}, {}, {}
    for n in ns:
        results["rlinf shm"][n] = group.rlinf_sync(n, args.rounds, False).wait()[0]
        results["rlinf shm views"][n] = group.rlinf_sync(n, args.rounds, False, True).wait()[0]
        results["rlinf TCP"][n] = group.rlinf_sync(n, args.rounds, True).wait()[0]
        results["rlinf shm shared"][n] = group.rlinf_sync(n, args.rounds, False, False, True).wait()[0]
        results["Ray object store"][n] = ray.get(source.sync.remote(receivers[:n], args.rounds))
        results["torch gloo"][n] = group.gloo_sync(n, args.rounds).wait()[0]
        floor[n] = copy_floor(args.size_mb, n, args.tensors)
        floor_one[n] = copy_floor(args.size_mb, n)
        tcp_fl[n] = tcp_floor(args.size_mb, n)
        print(f"N={n}: " + ", ".join(f"{k} {v[n]:.3f} s" for k, v in results.items()), flush=True)

    shm, tcp, ray_t, gloo, views, shared = (results[k] for k in results)
    rows = [[n, shm[n], shared[n], tcp[n], views[n], ray_t[n], gloo[n], floor[n], floor_one[n], tcp_fl[n],
             ray_t[n] / shm[n], ray_t[n] / shared[n], gloo[n] / shm[n], gloo[n] / shared[n], gloo[n] / tcp[n],
             ray_t[n] / views[n], shm[n] / floor[n], tcp[n] / tcp_fl[n], gloo[n] / tcp_fl[n]]
            for n in ns]
    print_table(f"Weight sync: {args.size_mb} MiB in {args.tensors} tensors, one source to N receivers on this host "
                f"(seconds, median of {args.rounds})",
                ["N", "rlinf shm", "shm shared", "rlinf TCP", "shm views", "Ray store", "gloo", "copy floor",
                 "(one buffer)", "TCP floor", "Ray/shm", "Ray/shared", "gloo/shm", "gloo/shared", "gloo/TCP",
                 "Ray/views", "shm/floor", "TCP/floor", "gloo/floor"], rows)
    print(f"(not targets) rlinf shm views: time at N={max(ns)} / time at N={min(ns)}: "
          f"{views[max(ns)] / views[min(ns)]:.2f}; copy floor at N={max(ns)} / N={min(ns)}: "
          f"{floor[max(ns)] / floor[min(ns)]:.2f} on {os.cpu_count()} CPUs")
    save_line_plot("weights", f"Broadcast of {args.size_mb} MiB in {args.tensors} tensors",
                   ns, {**{k: [v[n] for n in ns] for k, v in results.items()},
                        "copy floor (raw processes)": [floor[n] for n in ns],
                        "copy floor, one buffer (raw processes)": [floor_one[n] for n in ns],
                        "TCP floor (raw processes)": [tcp_fl[n] for n in ns]}, "time, lower is better (s)")
    lo = min(ns)
    targets = [
        Target(f"N={top}: Ray object store time / rlinf shm time", ray_t[top] / shm[top], ">=", 1.0),
        Target(f"N={top}: torch gloo time / rlinf shm time", gloo[top] / shm[top], ">=", 3.0),
        Target(f"rlinf shm: time at N={top} / time at N={lo}", shm[top] / shm[lo], "<=", 2.0),
        Target(f"N={top}: Ray object store time / rlinf shm shared time", ray_t[top] / shared[top], ">=", 1.0),
        Target(f"N={top}: torch gloo time / rlinf shm shared time", gloo[top] / shared[top], ">=", 3.0),
        Target(f"rlinf shm shared: time at N={top} / time at N={lo}", shared[top] / shared[lo], "<=", 2.0),
        Target(f"N={top}: torch gloo time / rlinf TCP time", gloo[top] / tcp[top], ">=", 3.0),
        Target(f"rlinf TCP: time at N={top} / time at N={lo}", tcp[top] / tcp[lo], "<=", 2.0),
    ]
    group.stop()
    close_cluster(cluster)
    return targets


if __name__ == "__main__":
    main()
