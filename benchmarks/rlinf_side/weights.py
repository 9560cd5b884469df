"""RLinf 0.3.0's side of ``benchmarks/weights.py``: one trainer broadcasts a state dict to N workers.

Arguments (JSON): ``size_mb``, ``tensors``, ``ns`` (a list), ``rounds`` as in
``benchmarks/weights.py``.

RLinf 0.3.0's ``Worker.broadcast(object, groups=...)`` returns a new object on
each receiver; it has no in-place form (``out=``), no shared-memory form and no
timeout, so its one series is compared with the project's broadcasts.  Times
run from the trainer's call until its broadcast returns and every receiver's
has returned (the slowest rank's time is taken), median of ``rounds`` after
one warm-up, as in the project's benchmark.

Prints: ``broadcast`` (N -> seconds).
"""

from __future__ import annotations

import statistics
import time

import _harness

from rlinf.scheduler import NodePlacementStrategy, Worker

MiB = 1 << 20
NAME = "bench_weights"


def _state_dict(size_mb: int, tensors: int, fill: float):
    import torch

    per = max(1, size_mb * MiB // tensors // 4)
    return {f"layer{i}.weight": torch.full((per,), fill + i) for i in range(tensors)}


class WeightWorker(Worker):
    """Rank 0 is the trainer; ranks 1..N the rollout workers."""

    def __init__(self, size_mb: int, tensors: int):
        super().__init__()
        self.sd = _state_dict(size_mb, tensors, 1.0) if self._rank == 0 else None

    def sync(self, n: int, rounds: int):
        if self._rank > n:
            return None
        groups = [(NAME, list(range(n + 1)))]
        times = []
        got = None
        for _ in range(rounds + 1):
            start = time.perf_counter()
            if self._rank == 0:
                self.broadcast(self.sd, groups=groups)
            else:
                got = None  # the previous round's state dict is dropped, as a receiver replacing its weights
                got = self.broadcast(None, groups=groups)
            times.append(time.perf_counter() - start)
        if self._rank:
            first = next(iter(got.values()))
            assert float(first[0]) == 1.0 and float(first[-1]) == 1.0, "the weights did not arrive"
        return statistics.median(times[1:])


def main() -> None:
    a = _harness.args()
    size_mb, tensors, ns, rounds = a.get("size_mb", 512), a.get("tensors", 64), a.get("ns", [1, 2, 4, 8]), a.get("rounds", 3)
    cluster = _harness.cluster()
    group = WeightWorker.create_group(size_mb, tensors).launch(
        cluster, NodePlacementStrategy([0] * (max(ns) + 1)), name=NAME)
    out = {"broadcast": {}}
    for n in ns:
        times = [t for t in group.sync(n, rounds).wait() if t is not None]
        out["broadcast"][str(n)] = max(times)
    group._close()
    _harness.emit(out)
    _harness.shutdown()


if __name__ == "__main__":
    main()
