"""Group call overhead and launch time against raw Ray actors, in one run.

    hatch run bench group [--with-rlinf]

Targets, each a time ratio rlinf / raw Ray of the same run:

* the first launch after ``Cluster()`` (4 workers on one node, launch + first
  answer) at most 1.25x the first launch of 4 raw Ray actors.  Both are
  measured from the same freshly started cluster, so each pays its own
  first-time costs; whichever goes first also pays the cluster's, so by
  default it runs twice, each time in a new cluster: raw Ray first, then
  rlinf first (``--first-orders``).  Each order is a row; the target is on both
  orders together (sum of rlinf's times over the sum of raw Ray's), where the
  order's advantage cancels;
* each later launch (median) at most 1.1x raw Ray's;
* ``group.noop().wait()`` over 4 workers at most 1.25x raw
  ``ray.get([a.noop.remote() for a in actors])``.

``--with-rlinf`` also runs the same work with RLinf 0.3.0 (its own virtual
environment and Ray, after this run's cluster has stopped; see
``rlinf_baseline.py``): an RLinf column, and the time ratio RLinf / rlinf
(>= 1 means rlinf is faster), with the target ">= 1x RLinf" on every row it
has.  RLinf's first launch is measured with raw Ray first.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import Target, add_run_options, close_cluster, local_cluster, parse, print_table, save_plot

import plots
import rlinf_baseline

from rlinf.scheduler import NodePlacementStrategy, Worker


class NoopWorker(Worker):
    def __init__(self):
        super().__init__()

    def noop(self):
        return None


class RawActor:
    def noop(self):
        return None


def raw_launch(raw_cls, n: int) -> tuple[float, list]:
    """Seconds to create ``n`` raw actors and get an answer from each; the actors."""
    import ray

    start = time.perf_counter()
    actors = [raw_cls.remote() for _ in range(n)]
    ray.get([a.noop.remote() for a in actors])
    return time.perf_counter() - start, actors


def our_launch(cluster, n: int, name: str) -> tuple[float, object]:
    """Seconds to launch a group of ``n`` workers and get its first answer; the group."""
    start = time.perf_counter()
    group = NoopWorker.create_group().launch(cluster, NodePlacementStrategy([0] * n), name=name)
    group.noop().wait()
    return time.perf_counter() - start, group


def first_launches(cluster, raw_cls, n: int, raw_first: bool) -> tuple[float, float]:
    """The first launch of raw actors and of a group in ``cluster`` (fresh), in the order given; (raw, ours)."""
    import ray

    def raw():
        t, actors = raw_launch(raw_cls, n)
        for a in actors:
            ray.kill(a)
        return t

    def ours():
        t, group = our_launch(cluster, n, "bench_first")
        group.stop()
        return t

    if raw_first:
        r = raw()
        return r, ours()
    o = ours()
    return raw(), o


def _rlinf_args(args) -> dict:
    return {"workers": args.workers, "calls": args.calls, "rounds": args.rounds, "launches": args.launches,
            "raw_first": True}


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--first-orders", default="raw,rlinf",
                        help="orders of the first launches, each in a new cluster: raw (raw Ray first), rlinf")
    rlinf_baseline.add_option(parser)
    add_run_options(parser, workers=2, calls=20, rounds=1, launches=1, first_orders="raw")
    args = parse(parser, argv)
    orders = [o.strip() for o in args.first_orders.split(",") if o.strip()]
    if not orders or set(orders) - {"raw", "rlinf"}:
        parser.error("--first-orders takes raw and/or rlinf")

    import ray

    n = args.workers
    raw_cls = ray.remote(num_cpus=0.01)(RawActor)

    # -- first launch after Cluster(), each order in a new cluster ----------------------------------
    first = {}
    for i, order in enumerate(orders):
        if i:
            close_cluster(cluster)
        cluster = local_cluster()
        first[order] = first_launches(cluster, raw_cls, n, raw_first=order == "raw")

    # -- later launches --------------------------------------------------------------------------
    raw_l, our_l = [], []
    for i in range(args.launches):
        t, actors = raw_launch(raw_cls, n)
        raw_l.append(t)
        for a in actors:
            ray.kill(a)
        t, group = our_launch(cluster, n, f"bench_launch_{i}")
        our_l.append(t)
        group.stop()

    # -- call overhead -------------------------------------------------------------------------
    _, actors = raw_launch(raw_cls, n)
    _, group = our_launch(cluster, n, "bench_calls")
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
    close_cluster(cluster)  # before RLinf's run: two Rays at once would share the machine's cores

    rl = rlinf_baseline.try_run_rlinf("group", _rlinf_args(args), args.rlinf_timeout) if args.with_rlinf else None
    return report(args, first, (raw_l, our_l), (raw_call, our_call), rl)


def report(args, first: dict, launches: tuple, calls: tuple, rl: dict | None) -> list:
    """Print the table, save the plot, return the targets."""
    n, med = args.workers, statistics.median
    nan = float("nan")
    raw_sum, our_sum = (sum(first[o][k] for o in first) for k in (0, 1))
    rows = []  # measure, raw, ours, RLinf (or None), bound vs raw, target name
    names = {"raw": "raw Ray first", "rlinf": "rlinf first"}
    for order, (r, o) in first.items():  # with one order, its row has the target; with both, their sum's has
        only = len(first) == 1
        rows.append([f"first launch after Cluster(), {names[order]} (s)", r, o,
                     rl["first"] if rl and order == "raw" else None, 1.25 if only else None,
                     f"first launch after Cluster() vs raw Ray ({names[order]})"])
    if len(first) > 1:
        rows.append(["first launch after Cluster(), both orders summed (s)", raw_sum, our_sum, None, 1.25,
                     "first launch after Cluster() vs raw Ray (both orders summed)"])
    rows.append(["each later launch, median (s)", med(launches[0]), med(launches[1]),
                 med(rl["launch"]) if rl and rl["launch"] else None, 1.1, "each later launch vs raw Ray"])
    rows.append(["group call noop (ms)", med(calls[0]) * 1e3, med(calls[1]) * 1e3,
                 med(rl["call"]) * 1e3 if rl else None, 1.25, "group call noop vs raw Ray"])

    header = ["measure", "raw Ray", "rlinf", "ratio (rlinf/raw)", "target"]
    if args.with_rlinf:
        header[3:3] = ["RLinf 0.3.0"]
        header[5:5] = ["RLinf/rlinf time (>= 1: rlinf faster)"]
    table, targets = [], []
    for measure, r, o, theirs, bound, tname in rows:
        goals = [f"<= {bound}"] if bound else []
        line = [measure, r, o, o / r]
        if args.with_rlinf:
            if theirs is None:
                why = "failed (see above)" if rl is None else "n/a (RLinf run: raw first only)"
                line[3:3] = [why]
                line.append("")
            else:
                line[3:3] = [theirs]
                line.append(f"{theirs / o:.2f}x")
                goals.append(">= 1x RLinf")
                targets.append(Target(f"{measure}: RLinf time / rlinf time", theirs / o, ">=", 1.0))
        line.append(", ".join(goals))
        table.append(line)
        if bound:
            targets.append(Target(tname, o / r, "<=", bound))
    print_table(f"Group benchmark ({n} workers, medians)", header, table)
    if rl:
        print(f"(RLinf's run, its own raw Ray baseline: first launch {rl['first_raw']:.3f} s, later launch "
              f"{med(rl['raw_launch']):.3f} s, call {med(rl['raw_call']) * 1e3:.3f} ms; machine drift between "
              "the two runs shows here)")

    series = {"raw Ray": [r for _, r, *_ in rows[:-1]], "rlinf": [o for _, _, o, *_ in rows[:-1]]}
    if args.with_rlinf:
        series["RLinf 0.3.0"] = [nan if t is None else t for *_, t, _, _ in rows[:-1]]
    labels = [m.replace(" (s)", "").replace("first launch after Cluster(), ", "first launch,\n") for m, *_ in rows[:-1]]
    call = {"raw Ray": [rows[-1][1]], "rlinf": [rows[-1][2]]}
    if args.with_rlinf:
        call["RLinf 0.3.0"] = [nan if rows[-1][3] is None else rows[-1][3]]
    save_plot(
        "group",
        f"{n} workers on one node (medians)" + (", with RLinf 0.3.0" if args.with_rlinf else ""),
        plots.bar(labels, series, "time (s)", title="launch + first answer"),
        plots.bar([f"{n} workers"], call, "time (ms)", title="group call, noop"),
    )
    return targets


if __name__ == "__main__":
    from run import main as run_main

    raise SystemExit(run_main(["group", *__import__("sys").argv[1:]]))
