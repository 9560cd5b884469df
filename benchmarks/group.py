"""Group call overhead and launch time against raw Ray actors, in one run.

    hatch run bench group

Targets: group.noop().wait() over 4 workers at most 1.25x raw
``ray.get([a.noop.remote() for a in actors])``; launching 4 workers at most
1.25x creating 4 raw actors and getting an answer from each.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import Target, add_run_options, close_cluster, local_cluster, parse, print_table, save_plot

import plots

from rlinf.scheduler import NodePlacementStrategy, Worker


class NoopWorker(Worker):
    def __init__(self):
        super().__init__()

    def noop(self):
        return None


class RawActor:
    def noop(self):
        return None


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--launches", type=int, default=4)
    add_run_options(parser, workers=2, calls=20, rounds=1, launches=1)
    args = parse(parser, argv)

    import ray

    cluster = local_cluster()
    raw_cls = ray.remote(num_cpus=0.01)(RawActor)
    n = args.workers

    # -- launch ------------------------------------------------------------------
    raw_launch, our_launch = [], []
    for i in range(args.launches):
        start = time.perf_counter()
        actors = [raw_cls.remote() for _ in range(n)]
        ray.get([a.noop.remote() for a in actors])
        raw_launch.append(time.perf_counter() - start)
        for a in actors:
            ray.kill(a)
        start = time.perf_counter()
        group = NoopWorker.create_group().launch(cluster, NodePlacementStrategy([0] * n), name=f"bench_launch_{i}")
        group.noop().wait()
        our_launch.append(time.perf_counter() - start)
        group.stop()

    # -- call overhead -------------------------------------------------------------
    actors = [raw_cls.remote() for _ in range(n)]
    ray.get([a.noop.remote() for a in actors])
    group = NoopWorker.create_group().launch(cluster, NodePlacementStrategy([0] * n), name="bench_calls")
    raw_call, our_call = [], []
    for _ in range(args.rounds):  # interleaved rounds: both see the same machine noise
        start = time.perf_counter()
        for _ in range(args.calls):
            ray.get([a.noop.remote() for a in actors])
        raw_call.append((time.perf_counter() - start) / args.calls)
        start = time.perf_counter()
        for _ in range(args.calls):
            group.noop().wait()
        our_call.append((time.perf_counter() - start) / args.calls)
    group.stop()

    raw_l, our_l = statistics.median(raw_launch), statistics.median(our_launch)
    raw_c, our_c = statistics.median(raw_call), statistics.median(our_call)
    print_table(
        f"Group benchmark ({n} workers, medians)",
        ["measure", "raw Ray", "rlinf", "ratio (rlinf/raw)", "target"],
        [
            ["launch + first answer (s)", raw_l, our_l, our_l / raw_l, "<= 1.25"],
            ["group call noop (ms)", raw_c * 1e3, our_c * 1e3, our_c / raw_c, "<= 1.25"],
        ],
    )
    save_plot(
        "group",
        f"rlinf vs raw Ray, {n} workers (medians)",
        plots.bar([f"{n} workers"], {"raw Ray": [raw_l], "rlinf": [our_l]}, "time (s)", title="launch + first answer"),
        plots.bar([f"{n} workers"], {"raw Ray": [raw_c * 1e3], "rlinf": [our_c * 1e3]}, "time (ms)",
                  title="group call, noop"),
    )
    close_cluster(cluster)
    return [Target("launch + first answer vs raw Ray", our_l / raw_l, "<=", 1.25),
            Target("group call noop vs raw Ray", our_c / raw_c, "<=", 1.25)]


if __name__ == "__main__":
    from run import main as run_main

    raise SystemExit(run_main(["group", *__import__("sys").argv[1:]]))
