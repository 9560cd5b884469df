"""RLinf 0.3.0's side of ``benchmarks/group.py``: launch time and group call overhead, next to raw Ray actors.

Arguments (JSON): ``workers``, ``calls``, ``rounds``, ``launches`` as in
``benchmarks/group.py``; ``raw_first`` (default true): 4 raw Ray actors are
launched before RLinf's first group, so both first launches start from the
same freshly started cluster, raw first, as the project's benchmark does.

Prints (seconds): ``first_raw`` and ``first`` (launch + first answer of the first
raw actors and of RLinf's first group after ``Cluster()``), ``raw_launch`` and
``launch`` (each later launch), ``raw_call`` and ``call`` (seconds per
``group.noop().wait()`` / raw ``ray.get``, one value per round).
"""

from __future__ import annotations

import time

import _harness

import ray
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
    start = time.perf_counter()
    actors = [raw_cls.remote() for _ in range(n)]
    ray.get([a.noop.remote() for a in actors])
    return time.perf_counter() - start, actors


def rlinf_launch(cluster, n: int, name: str) -> tuple[float, object]:
    """Seconds to launch an RLinf group of ``n`` workers and get its first answer; the group."""
    start = time.perf_counter()
    group = NoopWorker.create_group().launch(cluster, NodePlacementStrategy([0] * n), name=name)
    group.noop().wait()
    return time.perf_counter() - start, group


def main() -> None:
    a = _harness.args()
    n, calls, rounds, launches = a.get("workers", 4), a.get("calls", 300), a.get("rounds", 5), a.get("launches", 4)
    cluster = _harness.cluster()
    raw_cls = ray.remote(num_cpus=0.01)(RawActor)
    out = {"first_raw": None}
    if a.get("raw_first", True):
        out["first_raw"], actors = raw_launch(raw_cls, n)
        for actor in actors:
            ray.kill(actor)
    out["first"], group = rlinf_launch(cluster, n, "bench_first")
    group._close()  # RLinf 0.3.0 has no public stop: this kills the group's actors
    out["raw_launch"], out["launch"] = [], []
    for i in range(launches):  # the same alternation as the project's benchmark
        t, actors = raw_launch(raw_cls, n)
        out["raw_launch"].append(t)
        for actor in actors:
            ray.kill(actor)
        t, group = rlinf_launch(cluster, n, f"bench_launch_{i}")
        out["launch"].append(t)
        group._close()
    _, actors = raw_launch(raw_cls, n)
    _, group = rlinf_launch(cluster, n, "bench_calls")
    out["raw_call"], out["call"] = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            ray.get([actor.noop.remote() for actor in actors])
        out["raw_call"].append((time.perf_counter() - start) / calls)
        start = time.perf_counter()
        for _ in range(calls):
            group.noop().wait()
        out["call"].append((time.perf_counter() - start) / calls)
    group._close()
    _harness.emit(out)
    _harness.shutdown()


if __name__ == "__main__":
    main()
