"""Many workers on several simulated nodes, against raw Ray actors with the same placement.

    hatch run bench scale [--sizes 8,16,32,64] [--groups 4] [--nodes 4]

A private Ray cluster of ``--nodes`` nodes on this machine (``ray.cluster_utils``,
loopback, its own temp dir) hosts N workers in ``--groups`` groups, each group
spread over every node.  For each N it measures, in the same run:

* launch: every group launched and answering once, against raw Ray actors
  placed the same way (one placement group per group, one bundle per worker,
  each pinned to its node, all asked for at once) and answering once; each
  launch starts once the previous one's processes have exited, after one
  untimed launch of each kind;
* group call: a no-op on every group at once, against ``ray.get`` of a no-op on
  every raw actor;
* an all-to-all round (every worker sends a small object to every other and
  receives one from each), then the threads and descriptors each worker
  process holds, and its memory (RSS); the threads again after a second
  round and a pause ("settled": the threads a burst of sends took have exited).

Targets: launch and group call at most 1.25x raw Ray at every N.  The table
goes to stdout, the plot (time against N, one line per measure and baseline)
to ``benchmarks/results/scale.png``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

# this benchmark's nodes run as tests/ray_nodes.py starts them, without token authentication
# (loopback only); Ray reads the mode when it is imported, so drop the caller's settings first
for _key in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE"):
    os.environ.pop(_key, None)

from common import Target, add_run_options, parse, print_table, save_plot

import plots

from rlinf.scheduler import NodePlacementStrategy, Worker

SMALL = {"step": 0, "reward": 0.5, "done": False}


def _process_stats() -> dict:
    import psutil

    from rlinf.scheduler.messaging.p2p.communicator import local_communicator

    proc = psutil.Process()
    names = [t.name for t in threading.enumerate()]
    comm = local_communicator()
    return {
        "registry_lookups": comm.stats["registry_lookups"] if comm is not None else 0,
        "os_threads": proc.num_threads(),
        "py_threads": len(names),
        "rlinf_threads": sum(1 for n in names if n.startswith("rlinf")),
        "fds": proc.num_fds(),
        "rss": proc.memory_info().rss,
    }


class ScaleWorker(Worker):
    def __init__(self):
        super().__init__()

    def noop(self):
        return None

    def stats(self):
        return _process_stats()

    def all_to_all(self, peers):
        """Send to every peer (asynchronously), receive from every peer, wait for the sends."""
        me = (self.worker_group_name, self._rank)
        others = [tuple(p) for p in peers if tuple(p) != me]
        sends = [self.send(SMALL, g, r, async_op=True) for g, r in others]
        for g, r in others:
            self.recv(g, r)
        for s in sends:
            s.wait()
        return _process_stats()


class RawActor:
    def noop(self):
        return None


def _start_nodes(nodes: int):
    """``ray start`` processes on loopback, each in its own process group, in a temp dir of their own."""
    import sys

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
    from ray_nodes import RayNodes

    # Ray's cluster mode (more than one node) advertises this machine's address instead of loopback
    cluster = RayNodes(multi_node=nodes > 1)
    try:
        cluster.start_head(num_cpus=4)
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=4, wait=120)  # one by one: nodes started together can miss registration
    except BaseException:
        cluster.stop()  # the nodes that did come up
        raise
    return cluster


def _raw_launch(ray, placements: list[list], node_ids: list[str]):
    """Raw actors placed exactly as rlinf places workers: a placement group per group, bundles pinned by node id."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rlinf.ray.launcher import NODE_LABEL, WORKER_CPU

    raw_cls = ray.remote(RawActor)
    # every group's placement group and actors asked for at once, then one wait for all (as rlinf
    # launches groups before the first call waits): waiting group by group would serialize Ray's
    # worker start-ups and flatter rlinf
    pgs = [placement_group([{"CPU": WORKER_CPU}] * len(nodes), strategy="PACK",
                           bundle_label_selector=[{NODE_LABEL: node_ids[n]} for n in nodes]) for nodes in placements]
    ray.get([pg.ready() for pg in pgs], timeout=300)
    groups = [([raw_cls.options(num_cpus=WORKER_CPU, scheduling_strategy=PlacementGroupSchedulingStrategy(
        pg, placement_group_bundle_index=i)).remote() for i in range(len(nodes))], pg)
        for nodes, pg in zip(placements, pgs)]
    ray.get([a.noop.remote() for actors, _ in groups for a in actors], timeout=300)
    return groups


def _raw_stop(ray, groups) -> None:
    from ray.util.placement_group import remove_placement_group

    for actors, pg in groups:
        for a in actors:
            ray.kill(a)
        remove_placement_group(pg)


def _actor_processes() -> int:
    """Ray actor processes on this machine, every simulated node's (Ray titles them ``ray::Class...``;
    its pooled idle workers ``ray::IDLE``)."""
    import psutil

    count = 0
    for proc in psutil.process_iter(["cmdline"]):
        title = " ".join(proc.info["cmdline"] or ())
        if title.startswith("ray::") and not title.startswith("ray::IDLE"):
            count += 1
    return count


def _settle(baseline: int, limit: float = 180.0) -> None:
    """Wait (at most ``limit`` s) until the actor processes of the last launch have exited.  A launch of 64
    timed while the 64 actors stopped just before were still exiting took 5-10x as long here, whoever's
    launch it was, so an unsettled cluster decides the ratio by the order of the launches."""
    deadline = time.monotonic() + limit
    while _actor_processes() > baseline and time.monotonic() < deadline:
        time.sleep(0.5)


def _placements(n: int, groups: int, nodes: int) -> list[list[int]]:
    sizes = [n // groups + (1 if g < n % groups else 0) for g in range(groups)]
    out, k = [], 0
    for size in sizes:
        out.append([(k + i) % nodes for i in range(size)])
        k += size
    return out


def warm_up(cluster, ray) -> None:
    """One untimed launch of each kind: what a cluster does once, not per launch (rlinf's group registry
    actor, each side's first actor class export), stays out of the first size's launch times."""
    node_ids = [node.node_id for node in cluster.nodes]
    _raw_stop(ray, _raw_launch(ray, [[0]], node_ids))
    group = ScaleWorker.create_group().launch(cluster, NodePlacementStrategy([0]), name="scale_warm_up")
    group.noop().wait()
    group.stop()


def measure(cluster, ray, n: int, args, tag: str) -> dict:
    node_ids = [node.node_id for node in cluster.nodes]
    placements = _placements(n, args.groups, args.nodes)

    raw_launch, our_launch = [], []
    groups = None
    baseline = _actor_processes()

    def launch_ours(i):
        return [ScaleWorker.create_group().launch(cluster, NodePlacementStrategy(p), name=f"scale_{tag}_{i}_{g}")
                for g, p in enumerate(placements)]

    for i in range(args.launches):
        # alternate who goes first; each launch starts on a cluster where the last one's processes are gone
        for ours in ((False, True) if i % 2 == 0 else (True, False)):
            if groups is not None:
                for g in groups:
                    g.stop()
                groups = None
            _settle(baseline)
            start = time.perf_counter()
            if not ours:
                raw = _raw_launch(ray, placements, node_ids)
                raw_launch.append(time.perf_counter() - start)
                _raw_stop(ray, raw)
                continue
            groups = launch_ours(i)
            for g in groups:
                g.noop().wait()
            our_launch.append(time.perf_counter() - start)
    if groups is None:
        _settle(baseline)
        groups = launch_ours(args.launches)
        for g in groups:
            g.noop().wait()

    raw = _raw_launch(ray, placements, node_ids)
    actors = [a for group_actors, _ in raw for a in group_actors]
    raw_call, our_call = [], []
    for _ in range(args.rounds):  # interleaved: both see the same machine noise
        start = time.perf_counter()
        for _ in range(args.calls):
            ray.get([a.noop.remote() for a in actors])
        raw_call.append((time.perf_counter() - start) / args.calls)
        start = time.perf_counter()
        for _ in range(args.calls):
            for h in [g.noop() for g in groups]:
                h.wait()
        our_call.append((time.perf_counter() - start) / args.calls)
    _raw_stop(ray, raw)

    peers = [(g.worker_group_name, r) for g in groups for r in range(g.world_size)]
    before = [s for g in groups for s in g.stats().wait()]
    start = time.perf_counter()
    after = [s for h in [g.all_to_all(peers) for g in groups] for s in h.wait()]
    round_s = time.perf_counter() - start
    second = time.perf_counter()
    [s for h in [g.all_to_all(peers) for g in groups] for s in h.wait()]
    round2_s = time.perf_counter() - second
    from rlinf.scheduler.transports.ordering import _Pool

    time.sleep(_Pool.IDLE_EXIT + 1.0)  # the threads a burst of sends took exit once idle this long
    settled = [s for g in groups for s in g.stats().wait()]
    for g in groups:
        g.stop()
    return {
        "n": n,
        "raw_launch": statistics.median(raw_launch), "our_launch": statistics.median(our_launch),
        "raw_call": statistics.median(raw_call), "our_call": statistics.median(our_call),
        "round": round_s, "round2": round2_s, "launches": (raw_launch, our_launch),
        "threads_before": max(s["os_threads"] for s in before), "threads_after": max(s["os_threads"] for s in after),
        "rlinf_threads_after": max(s["rlinf_threads"] for s in after),
        "threads_settled": max(s["os_threads"] for s in settled),
        "rlinf_threads_settled": max(s["rlinf_threads"] for s in settled),
        "fds_before": max(s["fds"] for s in before), "fds_after": max(s["fds"] for s in after),
        "rss_mb": statistics.median(s["rss"] for s in after) / 2**20,
        "registry_lookups": max(s["registry_lookups"] for s in after),
    }


def save_scale_plot(rows: list[dict]) -> str:
    """The plot ``scale``: launch and all-to-all times (s) beside group-call times (ms), over the worker count."""
    ns = [r["n"] for r in rows]
    return save_plot(
        "scale", "Scale: times over the number of workers",
        plots.line(ns, {"launch, raw Ray": [r["raw_launch"] for r in rows],
                        "launch, rlinf": [r["our_launch"] for r in rows],
                        "all-to-all round (first, connects)": [r["round"] for r in rows],
                        "all-to-all round (second)": [r["round2"] for r in rows]},
                   "time (s)", "workers", title="launch and all-to-all",
                   styles={"launch, raw Ray": "o--", "all-to-all round (first, connects)": "s-",
                           "all-to-all round (second)": "s:"}),
        plots.line(ns, {"noop on every worker, raw Ray": [r["raw_call"] * 1e3 for r in rows],
                        "noop on every group, rlinf": [r["our_call"] * 1e3 for r in rows]},
                   "time (ms)", "workers", title="group call",
                   styles={"noop on every worker, raw Ray": "o--"}))


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="8,16,32,64", help="worker counts, comma-separated")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    # three of each: at 64 workers on 2 cores, one launch in four or five took 60 s or 120 s longer than
    # the others, raw Ray's or rlinf's alike, so a median needs three to be the typical launch
    parser.add_argument("--launches", type=int, default=3)
    add_run_options(parser, sizes="4", groups=2, nodes=2, calls=5, rounds=1, launches=1)
    args = parse(parser, argv)

    import ray

    from rlinf.scheduler import Cluster

    nodes = _start_nodes(args.nodes)
    rows = []
    try:
        os.environ.setdefault("RLINF_NODE_WAIT_TIMEOUT", "120")
        for attempt in range(6):  # the head's raylet may register with its GCS a while after the port opens
            try:
                ray.init(address=nodes.address, log_to_driver=False)
                break
            except ConnectionError:
                if attempt == 5:
                    raise
                time.sleep(5)
        cluster = Cluster(num_nodes=args.nodes)
        warm_up(cluster, ray)
        for n in [int(s) for s in args.sizes.split(",")]:
            rows.append(measure(cluster, ray, n, args, str(n)))
            r = rows[-1]
            print(f"N={n}: launch {r['our_launch']:.2f}s vs raw {r['raw_launch']:.2f}s, "
                  f"call {r['our_call'] * 1e3:.2f}ms vs raw {r['raw_call'] * 1e3:.2f}ms, "
                  f"round {r['round']:.2f}s, threads {r['threads_after']}, fds {r['fds_after']}; each launch: raw "
                  f"{', '.join(f'{t:.2f}' for t in r['launches'][0])} s, rlinf "
                  f"{', '.join(f'{t:.2f}' for t in r['launches'][1])} s", flush=True)
        cluster.shutdown()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        nodes.stop()

    print_table(
        f"Scale benchmark ({args.nodes} simulated nodes, {args.groups} groups; medians; threads/fds/RSS per worker process)",
        ["N", "launch raw Ray (s)", "launch rlinf (s)", "ratio", "call raw Ray (ms)", "call rlinf (ms)", "ratio",
         "all-to-all 1st (s)", "2nd (s)", "threads before/after/settled", "rlinf threads after/settled",
         "fds before/after", "RSS (MiB)",
         "registry lookups"],
        [[r["n"], r["raw_launch"], r["our_launch"], r["our_launch"] / r["raw_launch"], r["raw_call"] * 1e3,
          r["our_call"] * 1e3, r["our_call"] / r["raw_call"], r["round"], r["round2"],
          f"{r['threads_before']}/{r['threads_after']}/{r['threads_settled']}",
          f"{r['rlinf_threads_after']}/{r['rlinf_threads_settled']}",
          f"{r['fds_before']}/{r['fds_after']}", r["rss_mb"], r["registry_lookups"]] for r in rows],
    )
    print("  raw Ray (the baseline, same run): actors placed as rlinf places the workers (a placement group per "
          "group, bundles pinned to nodes), launched and called with ray.get of a no-op on every actor")
    save_scale_plot(rows)
    targets = []
    for r in rows:
        targets.append(Target(f"launch vs raw Ray at N={r['n']}", r["our_launch"] / r["raw_launch"], "<=", 1.25))
        targets.append(Target(f"group call vs raw Ray at N={r['n']}", r["our_call"] / r["raw_call"], "<=", 1.25))
    return targets


if __name__ == "__main__":
    from run import main as run_main

    raise SystemExit(run_main(["scale", *__import__("sys").argv[1:]]))
