"""The torch-gloo transport (rlinf-nccl) against the built-in cpu transport, same run.

    hatch run bench gloo [--sizes 1,64,256]

Two workers on this machine, one group per transport (chosen with
RLINF_TRANSPORT at launch).  Small object: round trip of a small dict.
Tensors: one-way bandwidth of send (object path) and send_tensor, streaming
K float32 tensors and waiting for an ack.  torch-gloo moves large frames over
gloo's TCP pair; the cpu transport uses shared memory between processes of
one host, so on one host gloo is expected to be slower: it is there for
users who want gloo's networking (and as the CPU proof of the torch pair
machinery that torch-nccl shares).

Floor (raw, measured in the same run): two plain processes streaming the same
K messages over one loopback socket into a warm buffer, what any transport
over TCP between two processes of this host cannot beat.
"""

from __future__ import annotations

import argparse
import os

from common import add_run_options, close_cluster, local_cluster, parse, print_table, save_bar_plot
from floors import tcp_floor
from p2p import BenchPeer

from rlinf.scheduler import NodePlacementStrategy

MiB = 1 << 20
TRANSPORTS = ["cpu", "torch-gloo"]


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1,64,256", help="tensor sizes in MiB")
    parser.add_argument("--pingpongs", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    add_run_options(parser, sizes="1", pingpongs=20, rounds=1)
    args = parse(parser, argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    cluster = local_cluster()
    groups = {}
    before = os.environ.get("RLINF_TRANSPORT")
    try:
        for name in TRANSPORTS:
            os.environ["RLINF_TRANSPORT"] = name  # forwarded to the group's workers at launch
            groups[name] = BenchPeer.create_group().launch(cluster, NodePlacementStrategy([0, 0]),
                                                           name=f"bench_{name.replace('-', '_')}")
    finally:
        if before is None:
            os.environ.pop("RLINF_TRANSPORT", None)
        else:
            os.environ["RLINF_TRANSPORT"] = before

    def best(fn, better=max):
        return better(fn() for _ in range(args.rounds))

    rtt = {n: best(lambda: g.ours_pingpong(args.pingpongs).wait()[0], min) for n, g in groups.items()}
    bw, floor = {}, {}
    for size in sizes:
        k = max(3, min(50, 512 // size))
        floor[size] = size * MiB * k / min(tcp_floor(size * MiB, 1, k, max(2, args.rounds)))
        for raw in (False, True):
            for n, g in groups.items():
                bw[(size, raw, n)] = best(lambda: g.ours_stream(size * MiB, k, raw).wait()[0])
    rows = [["small dict round trip (us)", f"{rtt['cpu'] * 1e6:.0f}", f"{rtt['torch-gloo'] * 1e6:.0f}", "-",
             f"{rtt['torch-gloo'] / rtt['cpu']:.2f}x cpu", "-"]]
    for size in sizes:
        for raw, what in ((False, "send/recv"), (True, "send_tensor")):
            c, g, f = bw[(size, raw, "cpu")], bw[(size, raw, "torch-gloo")], floor[size]
            rows.append([f"{size} MiB {what} (GB/s)", f"{c / 1e9:.2f}", f"{g / 1e9:.2f}", f"{f / 1e9:.2f}",
                         f"{g / c:.2f}x cpu", f"{f / g:.2f}"])
    print_table("torch-gloo against the cpu transport, two workers on this machine (best of rounds)",
                ["measure", "cpu", "torch-gloo", "TCP floor", "ratio", "torch-gloo time / TCP floor"], rows)
    print("  TCP floor: two plain processes, one loopback socket, the same K messages into a warm buffer "
          "(raw, same run)")
    labels = [f"{s} MiB\n{w}" for s in sizes for w in ("send", "send_tensor")]
    save_bar_plot("gloo", "One-way bandwidth: torch-gloo vs cpu transport", labels,
                  {**{n: [bw[(s, raw, n)] / 1e9 for s in sizes for raw in (False, True)] for n in TRANSPORTS},
                   "TCP floor (plain sockets)": [floor[s] / 1e9 for s in sizes for _ in (False, True)]},
                  "bandwidth (GB/s)")
    for g in groups.values():
        g.stop()
    close_cluster(cluster)


if __name__ == "__main__":
    main()
