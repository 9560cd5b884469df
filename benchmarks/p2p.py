"""Point-to-point: rlinf send/recv and send_tensor/recv_tensor against torch.distributed gloo, Ray
actor-to-actor transfer doing the same work, and this machine's floors, all in one run.

    hatch run bench p2p [--sizes 1,64,256] [--rounds 3] [--with-rlinf]

Small object: round-trip time of a small dict (gloo: a 4-float tensor; Ray: an actor call
returning its argument).  Tensors: one-way time per tensor, streaming K float32 tensors and
waiting for an ack, until the receiver holds the data:

* into a preallocated tensor: rlinf ``send_tensor`` -> ``recv_tensor(buf)``; gloo
  ``dist.send`` -> ``dist.recv(buf)``; Ray: the sender actor ``ray.put``s its array and
  passes the reference, the receiver actor ``ray.get``s it (a read-only view of the
  object store) and ``buf.copy_``s it into its own preallocated torch tensor.
* as a new tensor: rlinf ``send`` -> ``recv``; gloo ``dist.recv`` into a fresh
  ``torch.empty``; Ray as above with ``clone()`` instead of ``copy_`` (a tensor the
  receiver owns and may write).
* floors (raw, measured in the same run): "2 warm copies" is twice one warm
  ``dst.copy_(src)`` of the size in one process on one thread (a transfer through
  shared memory copies at least into it and out of it); "TCP floor" is two plain
  processes streaming the same K messages over a loopback socket into a warm buffer
  (what gloo, TCP between two processes, cannot beat).

Targets (same run): small round trip at most 0.5x gloo's; at 256 MiB, ``send_tensor``
at least 1x Ray's time (Ray time / rlinf time >= 1) and at most 1.25x two warm copies,
and each API at least 2x gloo and 1x Ray doing the same work.  With ``--with-rlinf``,
RLinf 0.3.0 runs the same calls in its own environment right after rlinf's run
(``rlinf_side/p2p.py``): an RLinf column, its ratio, its bars in the plot, and a target
on every row: RLinf time / rlinf time >= 1.
"""

from __future__ import annotations

import argparse
import time

from common import RoundTripPeer, Target, add_run_options, close_cluster, local_cluster, parse, print_table, save_plot
from floors import memcpy_floor, tcp_floor

import plots

from rlinf.scheduler import NodePlacementStrategy

MiB = 1 << 20
#: what each baseline does, printed under the table
BASELINES = {
    "gloo": "torch.distributed gloo send/recv between the same two workers (TCP over loopback), into the "
            "preallocated tensor, or into a fresh torch.empty for 'new tensor'",
    "Ray": "a sender actor ray.put()s its array and passes the ref; the receiver actor ray.get()s it and "
           "copy_()s it into its preallocated torch tensor, or clone()s it for 'new tensor'",
    "TCP floor": "two plain processes, one loopback socket, the same K messages into a warm buffer",
    "2 copies": "2 x one warm dst.copy_(src) of the size, one process, one thread (best of 7)",
}


class BenchPeer(RoundTripPeer):
    def __init__(self):
        super().__init__()
        self.peer = 1 - self._rank
        self.name = self.worker_group_name

    # -- rlinf ------------------------------------------------------------------
    def ours_pingpong(self, n):
        return self._time_round_trips(self._round_trip, n, warmup=20)

    def ours_stream(self, nbytes, k, raw):
        """Bytes per second of ``k`` tensors of ``nbytes`` from rank 0 to rank 1 (rank 1 returns None)."""
        import torch

        n = nbytes // 4
        if self._rank == 0:
            t = torch.ones(n)
            for _ in range(2):  # warm-up (also warms shared-memory segments)
                self._push(t, raw)
            self.recv(self.name, 1)
            start = time.perf_counter()
            for _ in range(k):
                self._push(t, raw)
            self.recv(self.name, 1)
            return nbytes * k / (time.perf_counter() - start)
        buf = torch.empty(n) if raw else None
        for _ in range(2):
            self._pull(buf, raw)
        self.send("ack", self.name, 0)
        for _ in range(k):
            self._pull(buf, raw)
        self.send("ack", self.name, 0)
        return None

    def _push(self, t, raw):
        if raw:
            self.send_tensor(t, self.name, 1)
        else:
            self.send(t, self.name, 1)

    def _pull(self, buf, raw):
        if raw:
            self.recv_tensor(buf, self.name, 0)
        else:
            self.recv(self.name, 0)  # dropped at once, as a consumer that is done with it

    # -- raw gloo -----------------------------------------------------------------
    def init_gloo(self):
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("gloo")
        return True

    def gloo_pingpong(self, n):
        import torch
        import torch.distributed as dist

        t = torch.zeros(4)
        def pp():
            if self._rank == 0:
                dist.send(t, 1)
                dist.recv(t, 1)
            else:
                dist.recv(t, 0)
                dist.send(t, 0)
        for _ in range(20):
            pp()
        start = time.perf_counter()
        for _ in range(n):
            pp()
        return (time.perf_counter() - start) / n

    def gloo_stream(self, nbytes, k, fresh):
        """Bytes per second of ``k`` gloo sends of ``nbytes``; the receiver fills one preallocated tensor, or a
        fresh one each time with ``fresh`` (rank 1 returns None)."""
        import torch
        import torch.distributed as dist

        n = nbytes // 4
        ack = torch.zeros(1)
        if self._rank == 0:
            t = torch.ones(n)
            for _ in range(2):
                dist.send(t, 1)
            dist.recv(ack, 1)
            start = time.perf_counter()
            for _ in range(k):
                dist.send(t, 1)
            dist.recv(ack, 1)
            return nbytes * k / (time.perf_counter() - start)
        buf = torch.zeros(n)
        for _ in range(2):
            dist.recv(torch.empty(n) if fresh else buf, 0)
        dist.send(ack, 0)
        for _ in range(k):
            dist.recv(torch.empty(n) if fresh else buf, 0)  # fresh: as a receiver would keep it
        dist.send(ack, 0)
        return None


class RayPeer:
    """Raw Ray actor-to-actor: the sender puts the array, the receiver gets it and copies it into a tensor."""

    def __init__(self, other=None):
        import warnings

        # ray.get gives read-only arrays; torch.from_numpy of one warns (the copy below never writes it)
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        self.other = other
        self.buf = None

    def set_other(self, other):
        self.other = other

    def echo(self, msg):
        return msg

    def consume(self, arr, fresh):
        """Copy ``arr`` (a read-only view of the object store) into this actor's preallocated tensor, or into
        a new one with ``fresh``; returns the bytes copied."""
        import torch

        src = torch.from_numpy(arr)
        if fresh:
            return src.clone().nbytes
        if self.buf is None or self.buf.numel() != src.numel():
            self.buf = torch.zeros(src.numel())  # preallocated and touched before the timed sends
        self.buf.copy_(src)
        return self.buf.nbytes

    def pingpong(self, n):
        import ray

        msg = {"step": 0, "reward": 0.5, "done": False, "info": "ok"}
        for _ in range(20):
            ray.get(self.other.echo.remote(msg))
        start = time.perf_counter()
        for _ in range(n):
            ray.get(self.other.echo.remote(msg))
        return (time.perf_counter() - start) / n

    def stream(self, nbytes, k, fresh):
        """Bytes per second of ``k`` arrays of ``nbytes`` put here and copied out by the other actor."""
        import numpy as np
        import ray

        arr = np.ones(nbytes // 4, dtype=np.float32)
        for _ in range(2):
            ray.get(self.other.consume.remote(ray.put(arr), fresh))
        start = time.perf_counter()
        refs = [self.other.consume.remote(ray.put(arr), fresh) for _ in range(k)]
        ray.get(refs)
        return nbytes * k / (time.perf_counter() - start)


def measure(args, sizes) -> tuple:
    """Round-trip seconds by system, and seconds per tensor by (size, kind) and system, all in one run."""
    import ray

    cluster = local_cluster()
    group = BenchPeer.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="bench_p2p")
    group.init_gloo().wait()
    remote = ray.remote(num_cpus=0.01)(RayPeer)
    ra, rb = remote.remote(), remote.remote()
    ray.get([ra.set_other.remote(rb), rb.set_other.remote(ra)])

    def best(fn, better=max):
        return better(fn() for _ in range(args.rounds))

    rtt = {
        "rlinf": best(lambda: group.ours_pingpong(args.pingpongs).wait()[0], min),
        "gloo": best(lambda: group.gloo_pingpong(args.pingpongs).wait()[0], min),
        "Ray": best(lambda: ray.get(ra.pingpong.remote(max(50, args.pingpongs // 10))), min),
    }
    per = {}
    for size in sizes:
        k = max(3, min(50, 512 // size))
        nbytes = size * MiB
        floors = {"TCP floor": min(tcp_floor(nbytes, 1, k, max(2, args.rounds))) / k,
                  "2 copies": 2 * memcpy_floor(nbytes)}
        for fresh, kind in ((False, "into"), (True, "new")):
            per[(size, kind)] = {
                "rlinf": nbytes / best(lambda: group.ours_stream(nbytes, k, not fresh).wait()[0]),
                "gloo": nbytes / best(lambda: group.gloo_stream(nbytes, k, fresh).wait()[0]),
                "Ray": nbytes / best(lambda: ray.get(ra.stream.remote(nbytes, k, fresh))),
                **floors,
            }
    group.stop()
    close_cluster(cluster)
    return rtt, per


def rlinf_side(args, sizes) -> tuple:
    """RLinf 0.3.0 doing the same work in its own environment (``rlinf_side/p2p.py``): its round-trip seconds
    and seconds per tensor by (size, kind), or ``(None, {})`` when it could not run (the reason is printed)."""
    from rlinf_baseline import try_run_rlinf

    got = try_run_rlinf("p2p", {"sizes": sizes, "pingpongs": args.pingpongs, "rounds": args.rounds},
                        args.rlinf_timeout)
    if got is None:
        return None, {}
    per = {}
    for size in sizes:
        bw = got["bw"][str(size)]
        per[(size, "into")] = size * MiB / bw["send_tensor"]
        per[(size, "new")] = size * MiB / bw["send/recv"]
    return got["rtt"], per


def main(argv=None):
    from rlinf_baseline import add_option

    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,64,256", help="tensor sizes in MiB")
    parser.add_argument("--pingpongs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    add_option(parser)
    add_run_options(parser, sizes="1", pingpongs=50, rounds=1)
    args = parse(parser, argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    rtt, per = measure(args, sizes)
    if args.with_rlinf:  # after ours: its Ray is gone, RLinf starts one of its own
        rtt["RLinf"], theirs = rlinf_side(args, sizes)
        for key, seconds in theirs.items():
            per[key]["RLinf"] = seconds
    with_rlinf = rtt.get("RLinf") is not None
    report(rtt, per, sizes, with_rlinf)
    return _targets(rtt, per, sizes, with_rlinf)


KINDS = {"into": "send_tensor -> recv_tensor(buf)", "new": "send -> recv (new tensor)"}


def report(rtt: dict, per: dict, sizes: list, with_rlinf: bool) -> None:
    """Print the table (times, then same-run ratios) with what each baseline does; save the plot."""
    extra = ["RLinf"] if with_rlinf else []
    systems = ["rlinf", *extra, "gloo", "Ray", "TCP floor", "2 copies"]
    ratio_of = lambda t: ([f"{t['RLinf'] / t['rlinf']:.2f}"] if with_rlinf else [])  # noqa: E731
    rows = [["small dict round trip (us)"] + [f"{rtt[s] * 1e6:.0f}" for s in ("rlinf", *extra, "gloo", "Ray")]
            + ["-", "-"] + ratio_of(rtt) + ["", f"{rtt['gloo'] / rtt['rlinf']:.2f}", "", ""]]
    for size in sizes:
        for kind, what in KINDS.items():
            t = per[(size, kind)]
            rows.append([f"{size} MiB {what} (ms)"] + [f"{t[s] * 1e3:.3g}" for s in systems] + ratio_of(t)
                        + [f"{t['Ray'] / t['rlinf']:.2f}", f"{t['gloo'] / t['rlinf']:.2f}",
                           f"{t['rlinf'] / t['2 copies']:.2f}", f"{t['gloo'] / t['TCP floor']:.2f}"])
    print_table("Point-to-point between two workers on this machine (best of rounds; a tensor's time runs until "
                "the receiver holds it)",
                ["measure", "rlinf", *(["RLinf 0.3.0"] if with_rlinf else []), "gloo", "Ray", "TCP floor",
                 "2 warm copies", *(["RLinf/rlinf"] if with_rlinf else []), "Ray/rlinf", "gloo/rlinf",
                 "rlinf/2 copies", "gloo/TCP floor"], rows)
    for name, work in {**(RLINF if with_rlinf else {}), **BASELINES}.items():
        print(f"  {name}: {work}")
    labels = [f"{s} MiB" for s in sizes]
    legend = {"rlinf": "rlinf", "RLinf": "RLinf 0.3.0", "gloo": "gloo", "Ray": "Ray (same work)",
              "TCP floor": "TCP floor (plain sockets)", "2 copies": "floor: 2 warm copies"}
    panels = [plots.bar(labels, {legend[s]: [z * MiB / per[(z, kind)][s] / 1e9 for z in sizes] for s in systems},
                        "bandwidth (GB/s)", title=what, log=True) for kind, what in KINDS.items()]
    save_plot("p2p", "One-way bandwidth by tensor size (higher is better; log scale)", *panels)


#: RLinf's column, printed under the table when it ran
RLINF = {"RLinf 0.3.0": "the same calls (send/recv, send_tensor/recv_tensor into a preallocated tensor) with RLinf "
                        "0.3.0 from PyPI in its own environment, right after rlinf's run (benchmarks/rlinf_side/p2p.py)"}


def _targets(rtt: dict, per: dict, sizes: list, with_rlinf: bool) -> list:
    """The same-run targets: the round trip against gloo, 256 MiB against Ray, gloo and two warm copies, and
    with RLinf's column every row against RLinf."""
    targets = [Target("small round trip: rlinf time / gloo time", rtt["rlinf"] / rtt["gloo"], "<=", 0.5)]
    if 256 in sizes:
        into, new = per[(256, "into")], per[(256, "new")]
        targets += [
            Target("256 MiB send_tensor: Ray (put, get, copy_) time / rlinf time", into["Ray"] / into["rlinf"], ">=", 1.0),
            Target("256 MiB send_tensor: rlinf time / two warm copies", into["rlinf"] / into["2 copies"], "<=", 1.25),
            Target("256 MiB send_tensor: gloo time / rlinf time", into["gloo"] / into["rlinf"], ">=", 2.0),
            Target("256 MiB send/recv: Ray (put, get, clone) time / rlinf time", new["Ray"] / new["rlinf"], ">=", 1.0),
            Target("256 MiB send/recv: gloo time / rlinf time", new["gloo"] / new["rlinf"], ">=", 2.0),
        ]
    if with_rlinf:
        targets.append(Target("small round trip: RLinf time / rlinf time", rtt["RLinf"] / rtt["rlinf"], ">=", 1.0))
        targets += [Target(f"{size} MiB {what}: RLinf time / rlinf time",
                           per[(size, kind)]["RLinf"] / per[(size, kind)]["rlinf"], ">=", 1.0)
                    for size in sizes for kind, what in KINDS.items()]
    return targets


if __name__ == "__main__":
    from run import main as run_main

    raise SystemExit(run_main(["p2p", *__import__("sys").argv[1:]]))
