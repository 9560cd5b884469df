"""Point-to-point: rlinf send/recv and send_tensor/recv_tensor against raw
torch.distributed gloo and Ray actor-to-actor transfer, in one run.

    hatch run bench p2p

Small object: round-trip time of a small dict (gloo: a 4-float tensor).
Tensors: one-way bandwidth, streaming K float32 tensors and waiting for an ack.
Targets: 256 MiB at least 2x gloo and 1x Ray; small round trip at most 0.5x gloo's.
"""

from __future__ import annotations

import argparse
import time

from common import RoundTripPeer, Target, add_run_options, close_cluster, local_cluster, parse, print_table, save_bar_plot

from rlinf.scheduler import NodePlacementStrategy

MiB = 1 << 20


class BenchPeer(RoundTripPeer):
    def __init__(self):
        super().__init__()
        self.peer = 1 - self._rank
        self.name = self.worker_group_name

    # -- rlinf ------------------------------------------------------------------
    def ours_pingpong(self, n):
        return self._time_round_trips(self._round_trip, n, warmup=20)

    def ours_stream(self, nbytes, k, raw):
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

    def gloo_stream(self, nbytes, k):
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
        for _ in range(2):
            dist.recv(torch.empty(n), 0)
        dist.send(ack, 0)
        for _ in range(k):
            dist.recv(torch.empty(n), 0)  # a fresh tensor each time, as a receiver would keep it
        dist.send(ack, 0)
        return None


class RayPeer:
    """Raw Ray actor-to-actor: the sender puts the array, the receiver reads it zero-copy."""

    def __init__(self, other=None):
        self.other = other

    def set_other(self, other):
        self.other = other

    def echo(self, msg):
        return msg

    def consume(self, arr):
        return arr.nbytes

    def pingpong(self, n):
        import ray

        msg = {"step": 0, "reward": 0.5, "done": False, "info": "ok"}
        for _ in range(20):
            ray.get(self.other.echo.remote(msg))
        start = time.perf_counter()
        for _ in range(n):
            ray.get(self.other.echo.remote(msg))
        return (time.perf_counter() - start) / n

    def stream(self, nbytes, k):
        import numpy as np
        import ray

        arr = np.ones(nbytes // 4, dtype=np.float32)
        for _ in range(2):
            ray.get(self.other.consume.remote(ray.put(arr)))
        start = time.perf_counter()
        refs = [self.other.consume.remote(ray.put(arr)) for _ in range(k)]
        ray.get(refs)
        return nbytes * k / (time.perf_counter() - start)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,64,256", help="tensor sizes in MiB")
    parser.add_argument("--pingpongs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    add_run_options(parser, sizes="1", pingpongs=50, rounds=1)
    args = parse(parser, argv)
    sizes = [int(s) for s in args.sizes.split(",")]

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
        "rlinf send/recv": best(lambda: group.ours_pingpong(args.pingpongs).wait()[0], min),
        "gloo": best(lambda: group.gloo_pingpong(args.pingpongs).wait()[0], min),
        "Ray actors": best(lambda: ray.get(ra.pingpong.remote(max(50, args.pingpongs // 10))), min),
    }
    bw = {}
    for size in sizes:
        k = max(3, min(50, 512 // size))
        nbytes = size * MiB
        bw[size] = {
            "rlinf send/recv": best(lambda: group.ours_stream(nbytes, k, False).wait()[0]),
            "rlinf send_tensor": best(lambda: group.ours_stream(nbytes, k, True).wait()[0]),
            "gloo": best(lambda: group.gloo_stream(nbytes, k).wait()[0]),
            "Ray actors": best(lambda: ray.get(ra.stream.remote(nbytes, k))),
        }
    rows = [["small dict round trip (us)"] + [f"{rtt[k] * 1e6:.0f}" for k in ("rlinf send/recv", "gloo", "Ray actors")]
            + [f"{rtt['rlinf send/recv'] / rtt['gloo']:.2f}x gloo (target <= 0.5)"]]
    for size in sizes:
        b = bw[size]
        rows.append([f"{size} MiB send/recv (GB/s)", f"{b['rlinf send/recv'] / 1e9:.2f}", f"{b['gloo'] / 1e9:.2f}",
                     f"{b['Ray actors'] / 1e9:.2f}",
                     f"{b['rlinf send/recv'] / b['gloo']:.2f}x gloo, {b['rlinf send/recv'] / b['Ray actors']:.2f}x Ray"])
        rows.append([f"{size} MiB send_tensor (GB/s)", f"{b['rlinf send_tensor'] / 1e9:.2f}", "", "",
                     f"{b['rlinf send_tensor'] / b['gloo']:.2f}x gloo, {b['rlinf send_tensor'] / b['Ray actors']:.2f}x Ray"])
    print_table("Point-to-point between two workers on this machine (best of rounds)",
                ["measure", "rlinf", "gloo", "Ray actors", "ratio"], rows)
    names = ["rlinf send/recv", "rlinf send_tensor", "gloo", "Ray actors"]
    save_bar_plot("p2p", "One-way bandwidth by tensor size", [f"{s} MiB" for s in sizes],
                  {n: [bw[s][n] / 1e9 for s in sizes] for n in names}, "bandwidth (GB/s)")
    group.stop()
    close_cluster(cluster)
    targets = [Target("small round trip vs gloo", rtt["rlinf send/recv"] / rtt["gloo"], "<=", 0.5)]
    if 256 in bw:
        b = bw[256]
        for api in ("rlinf send/recv", "rlinf send_tensor"):
            targets += [Target(f"256 MiB {api} vs gloo", b[api] / b["gloo"], ">=", 2.0),
                        Target(f"256 MiB {api} vs Ray", b[api] / b["Ray actors"], ">=", 1.0)]
    return targets


if __name__ == "__main__":
    from run import main as run_main

    raise SystemExit(run_main(["p2p", *__import__("sys").argv[1:]]))
