"""Weight sync: one trainer broadcasts a state dict to N rollout workers on this host, same run.

    hatch run bench weights [--size-mb 512] [--tensors 64] [--ns 1,2,4,8] [--rounds 3] [--with-rlinf]

* rlinf shm: ``broadcast(state_dict)`` on the trainer, ``broadcast(out=own_state_dict)``
  on each receiver (filled in place); the payload is written once into shared memory.
* rlinf shm shared: the same with ``share_memory=True`` on the receivers: the memory behind
  their state dicts' tensors moves onto the segment the source wrote (same tensor objects;
  the source alternates between two segments, never writing one a receiver is on); no
  receiver copies anything.
* rlinf TCP: the same with ``RLINF_CPU_LOCAL=0`` (a chunked, pipelined chain).
* rlinf shm views: ``broadcast(groups=...)`` without ``out=``: receivers get copy-on-write
  views of the segment (no copy), kept until the next round (not compared: no baseline
  here does that work).
* Ray object store, doing the work ``broadcast(out=)`` does, in the same worker processes:
  the trainer ``ray.put``s its state dict as numpy arrays once; each of the N receivers
  ``ray.get``s it (read-only views of the object store) and ``copy_``s every array into
  its own state dict (the tensors ``broadcast(out=)`` fills).  The reference reaches them
  by a group call, which is a Ray actor call; timed from before the put until the last
  receiver's copy is done.
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
receivers' replies).  Median of ``--rounds`` after one warm-up; the floors are
measured in the same run, after each N's systems.

Targets at the largest N: ``broadcast(out=)`` and ``shm shared`` at least 1x Ray and
3x gloo, rlinf TCP at least 3x gloo, each at most 2x its time at the smallest N; and at
N=8 (when measured) ``broadcast(out=)`` at most 1.3x the copy floor.  With ``--with-rlinf``,
RLinf 0.3.0 runs the same broadcast in its own environment after rlinf's run
(``rlinf_side/weights.py``); its only form hands each receiver a new state dict, the
work of rlinf's ``broadcast`` without ``out=`` (shm views), which must be at least 1x
RLinf at every N; its ratio to ``broadcast(out=)`` is printed too.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from common import Target, add_run_options, close_cluster, local_cluster, parse, print_table, save_plot
from floors import copy_floor, tcp_floor

import plots

from rlinf.scheduler import NodePlacementStrategy, Worker

MiB = 1 << 20
NAME = "bench_weights"
#: every measured system -> its column in the tables and its line in the plot
SYSTEMS = {
    "rlinf shm": "rlinf broadcast(out=)",
    "rlinf shm shared": "rlinf shm shared",
    "rlinf shm views": "rlinf shm views",
    "rlinf TCP": "rlinf TCP",
    "Ray object store": "Ray put+get+copy_",
    "torch gloo": "gloo broadcast",
    "copy floor": "copy floor",
    "copy floor, one buffer": "copy floor (1 buffer)",
    "TCP floor": "TCP floor",
}
#: RLinf 0.3.0's series, with ``--with-rlinf``
RLINF = "RLinf 0.3.0"
#: what each does, printed under the table
WORK = {
    RLINF: "RLinf 0.3.0 from PyPI in its own environment, right after rlinf's run: broadcast(state_dict, groups=...) "
           "on the trainer, broadcast(None, groups=...) on each receiver, which gets a new state dict (its one "
           "form; the work of rlinf's broadcast without out=) (benchmarks/rlinf_side/weights.py)",
    "rlinf shm": "rlinf over shared memory, each receiver fills its own state dict in place",
    "rlinf shm shared": "the same with share_memory=True: the receivers' tensors move onto the segment (no copy)",
    "rlinf shm views": "no out=: receivers get read-only views of the segment (no copy)",
    "rlinf TCP": "the same as broadcast(out=) with RLINF_CPU_LOCAL=0: a pipelined chain over loopback TCP",
    "Ray object store": "the trainer ray.put()s its state dict (numpy views) once; the N receivers (the same "
                        "worker processes) ray.get() it and copy_() every array into their own state dict, the "
                        "tensors broadcast(out=) fills; the ref reaches them by a group call (a Ray actor call)",
    "torch gloo": "dist.broadcast of every tensor into the receivers' own tensors (TCP over loopback)",
    "copy floor": "raw: N plain processes each copy the payload out of one warm shared mapping into their own "
                  "warm state dict, all at once",
    "copy floor, one buffer": "raw: the same into one buffer per process (one large memcpy each)",
    "TCP floor": "raw: N plain sender processes each stream the payload over loopback TCP into a warm buffer "
                 "of one of N plain receivers, all at once",
}


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

    def ray_put(self):
        """Rank 0: put the state dict (as numpy arrays) into Ray's object store; returns the start time and
        ``[ref]`` (in a list: Ray hands a nested reference on as it is)."""
        import ray

        start = time.perf_counter()
        return start, [ray.put({k: v.numpy() for k, v in self.sd.items()})]

    def ray_receive(self, refs):
        """A receiver: ``ray.get`` the state dict (read-only views of the object store) and ``copy_`` every array
        into this worker's own tensors, the ones ``broadcast(out=)`` fills; returns the time it is done."""
        import warnings

        import ray
        import torch

        first = next(iter(self.sd.values()))
        first[0], first[-1] = 0.0, 0.0  # so that the check below sees this round's data
        arrays = ray.get(refs[0])
        with warnings.catch_warnings():  # from_numpy of a read-only array warns; copy_ only reads it
            warnings.simplefilter("ignore", UserWarning)
            for name, arr in arrays.items():
                self.sd[name].copy_(torch.from_numpy(arr))
        done = time.perf_counter()
        assert float(first[0]) == 1.0 and float(first[-1]) == 1.0, "the weights did not arrive"
        return done

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


def ray_sync(group, n: int, rounds: int) -> float:
    """Median seconds over ``rounds`` (after one warm-up) of Ray's object store doing ``broadcast(out=)``'s work:
    rank 0 ``ray.put``s its state dict; ranks 1..n get it and copy it into their own state dicts.  Timed from
    before the put to the last receiver's copy (``perf_counter`` is one monotonic clock for every process here)."""
    receivers = group.execute_on(*range(1, n + 1))
    times = []
    for _ in range(rounds + 1):
        start, refs = group.execute_on(0).ray_put().wait()[0]
        times.append(max(receivers.ray_receive(refs).wait()) - start)
        del refs
    return statistics.median(times[1:])


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
    from rlinf_baseline import add_option

    add_option(parser)
    add_run_options(parser, size_mb=8, tensors=4, ns="1,2", rounds=1)
    args = parse(parser, argv)
    ns = [int(n) for n in args.ns.split(",")]
    results = measure(args, ns)
    if args.with_rlinf:  # after ours: its Ray is gone, RLinf starts one of its own
        from rlinf_baseline import try_run_rlinf

        got = try_run_rlinf("weights", {"size_mb": args.size_mb, "tensors": args.tensors, "ns": ns,
                                        "rounds": args.rounds}, args.rlinf_timeout)
        if got is not None:
            results[RLINF] = {n: got["broadcast"][str(n)] for n in ns}
    report(args, ns, results)
    return _targets(results, ns)


def measure(args, ns: list) -> dict:
    """Seconds by system (``SYSTEMS``) and receiver count, all in one run."""
    top = max(ns)

    cluster = local_cluster()
    group = WeightWorker.create_group(args.size_mb, args.tensors).launch(
        cluster, NodePlacementStrategy([0] * (top + 1)), name=NAME)
    group.init_gloo(ns).wait()
    results = {k: {} for k in SYSTEMS}
    for n in ns:
        results["rlinf shm"][n] = group.rlinf_sync(n, args.rounds, False).wait()[0]
        results["rlinf shm views"][n] = group.rlinf_sync(n, args.rounds, False, True).wait()[0]
        results["rlinf TCP"][n] = group.rlinf_sync(n, args.rounds, True).wait()[0]
        results["rlinf shm shared"][n] = group.rlinf_sync(n, args.rounds, False, False, True).wait()[0]
        results["Ray object store"][n] = ray_sync(group, n, args.rounds)
        results["torch gloo"][n] = group.gloo_sync(n, args.rounds).wait()[0]
        results["copy floor"][n] = copy_floor(args.size_mb, n, args.tensors)
        results["copy floor, one buffer"][n] = copy_floor(args.size_mb, n)
        results["TCP floor"][n] = tcp_floor(args.size_mb * MiB, n)[-1]  # the second round: warm buffers
        print(f"N={n}: " + ", ".join(f"{k} {v[n]:.3f} s" for k, v in results.items()), flush=True)
    group.stop()
    close_cluster(cluster)
    return results


def report(args, ns: list, r: dict) -> None:
    """Print the times and their ratios, with what each baseline does; save the plot."""
    top = max(ns)
    systems = {**SYSTEMS, **({RLINF: RLINF} if RLINF in r else {})}
    print_table(f"Weight sync: {args.size_mb} MiB in {args.tensors} tensors, one source to N receivers on this host "
                f"(seconds, median of {args.rounds})", ["N"] + [systems[k] for k in systems],
                [[n] + [r[k][n] for k in systems] for n in ns])
    for k, work in systems.items():
        print(f"  {work}: {WORK[k]}")
    ratios = {**({"RLinf / views": (RLINF, "rlinf shm views"), "RLinf / out=": (RLINF, "rlinf shm")}
                 if RLINF in r else {}),"Ray / out=": ("Ray object store", "rlinf shm"), "Ray / shared": ("Ray object store", "rlinf shm shared"),
              "gloo / out=": ("torch gloo", "rlinf shm"), "gloo / shared": ("torch gloo", "rlinf shm shared"),
              "gloo / TCP": ("torch gloo", "rlinf TCP"), "out= / copy floor": ("rlinf shm", "copy floor"),
              "TCP / TCP floor": ("rlinf TCP", "TCP floor"), "gloo / TCP floor": ("torch gloo", "TCP floor")}
    print_table("Weight sync: same-run ratios of the times above (>= 1: rlinf faster; X / floor: times the floor)",
                ["N"] + list(ratios), [[n] + [r[a][n] / r[b][n] for a, b in ratios.values()] for n in ns])
    print(f"(not targets) rlinf shm views: time at N={top} / time at N={min(ns)}: "
          f"{r['rlinf shm views'][top] / r['rlinf shm views'][min(ns)]:.2f}; copy floor at N={top} / N={min(ns)}: "
          f"{r['copy floor'][top] / r['copy floor'][min(ns)]:.2f} on {os.cpu_count()} CPUs")
    plotted = [k for k in systems if k != "copy floor, one buffer"]
    save_line_plot("weights", f"Broadcast of {args.size_mb} MiB in {args.tensors} tensors",
                   ns, {systems[k]: [r[k][n] for n in ns] for k in plotted}, "time, lower is better (s)")


def _targets(r: dict, ns: list) -> list:
    """The same-run targets: at the largest N, the copy floor's at N=8 when it was measured, and RLinf's at every
    N when it ran."""
    top, lo = max(ns), min(ns)
    shm, shared, tcp, ray_t, gloo = (r[k] for k in ("rlinf shm", "rlinf shm shared", "rlinf TCP",
                                                    "Ray object store", "torch gloo"))
    targets = [
        Target(f"N={top}: Ray (put, get, copy_) time / broadcast(out=) time", ray_t[top] / shm[top], ">=", 1.0),
        Target(f"N={top}: torch gloo time / broadcast(out=) time", gloo[top] / shm[top], ">=", 3.0),
        Target(f"broadcast(out=): time at N={top} / time at N={lo}", shm[top] / shm[lo], "<=", 2.0),
        Target(f"N={top}: Ray (put, get, copy_) time / rlinf shm shared time", ray_t[top] / shared[top], ">=", 1.0),
        Target(f"N={top}: torch gloo time / rlinf shm shared time", gloo[top] / shared[top], ">=", 3.0),
        Target(f"rlinf shm shared: time at N={top} / time at N={lo}", shared[top] / shared[lo], "<=", 2.0),
        Target(f"N={top}: torch gloo time / rlinf TCP time", gloo[top] / tcp[top], ">=", 3.0),
        Target(f"rlinf TCP: time at N={top} / time at N={lo}", tcp[top] / tcp[lo], "<=", 2.0),
    ]
    if 8 in ns:
        targets.append(Target("N=8: broadcast(out=) time / copy floor", shm[8] / r["copy floor"][8], "<=", 1.3))
    if RLINF in r:  # every N: RLinf's broadcast against the same call in rlinf (no out=)
        targets += [Target(f"N={n}: RLinf broadcast time / rlinf broadcast (no out=) time",
                           r[RLINF][n] / r["rlinf shm views"][n], ">=", 1.0) for n in ns]
    return targets


if __name__ == "__main__":
    from run import main as run_main

    raise SystemExit(run_main(["weights", *__import__("sys").argv[1:]]))
