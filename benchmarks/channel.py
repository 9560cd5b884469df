"""Channel throughput against ``ray.util.queue.Queue``, in one run.

    hatch run bench channel

A producer and a consumer worker move N messages of each kind (a small dict,
a 1 MiB tensor, a list of 8 tensors of 128 KiB): put and get concurrently,
then put-only, then get-only.  Targets: at least 2x the Ray queue's
throughput for 1 MiB tensors and at least 1x for small dicts.
"""

from __future__ import annotations

import argparse
import time

from common import Target, add_run_options, close_cluster, local_cluster, parse, print_table, save_bar_plot

from rlinf.scheduler import Channel, NodePlacementStrategy, Worker


def make_item(kind: str, i: int):
    import torch

    if kind == "small dict":
        return {"step": i, "reward": 0.5, "done": False}
    if kind == "1 MiB tensor":
        return torch.full((1 << 18,), float(i))
    return [torch.full((1 << 15,), float(i)) for _ in range(8)]


class Endpoint(Worker):
    def __init__(self):
        super().__init__()

    def put_all(self, queue, kind, n, ours):
        items = [make_item(kind, i) for i in range(min(n, 16))]
        start = time.perf_counter()
        for i in range(n):
            item = items[i % len(items)]
            if ours:
                queue.put(item)
            else:
                queue.put(item)
        return start, time.perf_counter()

    def get_all(self, queue, kind, n, ours):
        start = time.perf_counter()
        for _ in range(n):
            item = queue.get()
            del item
        return start, time.perf_counter()


def run_case(prod, cons, queue, kind, n, ours):
    out = {}
    p, c = prod.put_all(queue, kind, n, ours), cons.get_all(queue, kind, n, ours)
    (ps, pe), = p.wait()
    (cs, ce), = c.wait()
    out["concurrent"] = n / (max(pe, ce) - min(ps, cs))
    (ps, pe), = prod.put_all(queue, kind, n, ours).wait()
    out["put-only"] = n / (pe - ps)
    (cs, ce), = cons.get_all(queue, kind, n, ours).wait()
    out["get-only"] = n / (ce - cs)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=50)
    add_run_options(parser, messages=20, warmup=5)
    args = parse(parser, argv)
    from ray.util.queue import Queue

    cluster = local_cluster()
    prod = Endpoint.create_group().launch(cluster, NodePlacementStrategy([0]), name="bench_producer")
    cons = Endpoint.create_group().launch(cluster, NodePlacementStrategy([0]), name="bench_consumer")
    ours = Channel.create("bench_channel")
    theirs = Queue(actor_options={"num_cpus": 0.01})
    kinds = ["small dict", "1 MiB tensor", "list of 8 tensors"]
    results = {}
    for kind in kinds:
        run_case(prod, cons, ours, kind, args.warmup, True)  # warm-up: connections, shared memory
        run_case(prod, cons, theirs, kind, args.warmup, False)
        results[kind] = (run_case(prod, cons, ours, kind, args.messages, True),
                         run_case(prod, cons, theirs, kind, args.messages, False))
    rows = []
    for kind in kinds:
        o, t = results[kind]
        for mode in ("concurrent", "put-only", "get-only"):
            rows.append([kind, mode, f"{o[mode]:.0f}", f"{t[mode]:.0f}", f"{o[mode] / t[mode]:.2f}x"])
    print_table(f"Channel vs ray.util.queue.Queue, {args.messages} messages (items/s)",
                ["item", "mode", "rlinf Channel", "Ray Queue", "ratio"], rows)
    save_bar_plot("channel", "Concurrent put+get throughput", kinds,
                  {"rlinf Channel": [results[k][0]["concurrent"] for k in kinds],
                   "Ray Queue": [results[k][1]["concurrent"] for k in kinds]}, "items/s", log=True)
    prod.stop()
    cons.stop()
    close_cluster(cluster)
    ratio = {k: results[k][0]["concurrent"] / results[k][1]["concurrent"] for k in kinds}
    return [Target("1 MiB tensors concurrent vs Ray Queue", ratio["1 MiB tensor"], ">=", 2.0),
            Target("small dicts concurrent vs Ray Queue", ratio["small dict"], ">=", 1.0)]


if __name__ == "__main__":
    from run import main as run_main

    raise SystemExit(run_main(["channel", *__import__("sys").argv[1:]]))
