"""Shared helpers for benchmarks: environment, tables, plots.

Every benchmark compares against a raw baseline measured in the same run and
reports the ratio, because absolute times drift between runs and machines.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")


def _compile_rlinf() -> None:
    """Bytecode for the rlinf sources the workers import, as an installed wheel has.

    Raw Ray's modules come with bytecode; rlinf's, in a source checkout run with
    ``PYTHONDONTWRITEBYTECODE``, would be compiled again by every worker (0.13 s
    of CPU each), which is a cost of the checkout, not of rlinf.  Up-to-date
    files are skipped."""
    import compileall

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "packages")
    if os.path.isdir(root):
        compileall.compile_dir(root, quiet=1)


_compile_rlinf()

from rlinf.scheduler import Worker  # noqa: E402  (after the environment above)

RESULTS = os.environ.get("RLINF_BENCH_RESULTS") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
#: the small object whose round trip the point-to-point benchmarks time
SMALL_MESSAGE = {"step": 0, "reward": 0.5, "done": False, "info": "ok"}


class RoundTripPeer(Worker):
    """Rank 0 and rank 1 of one group bounce a small object with rlinf's send/recv."""

    def _round_trip(self, msg):
        name = self.worker_group_name
        if self._rank == 0:
            self.send(msg, name, 1)
            self.recv(name, 1)
        else:
            self.send(self.recv(name, 0), name, 0)

    @staticmethod
    def _time_round_trips(one, n: int, warmup: int) -> float:
        """Seconds per round trip of ``one(SMALL_MESSAGE)``, after ``warmup`` untimed ones."""
        for _ in range(warmup):
            one(SMALL_MESSAGE)
        start = time.perf_counter()
        for _ in range(n):
            one(SMALL_MESSAGE)
        return (time.perf_counter() - start) / n


def local_cluster():
    """A local Ray cluster in a short-lived temp dir (removed by ``close_cluster``)."""
    import tempfile

    from rlinf.scheduler import Cluster

    temp_dir = tempfile.mkdtemp(prefix="rlb")  # short: Ray's socket paths must fit in 107 bytes
    cluster = Cluster(temp_dir=temp_dir, log_to_driver=False)
    cluster.bench_temp_dir = temp_dir
    return cluster


def close_cluster(cluster) -> None:
    import shutil

    cluster.shutdown()
    shutil.rmtree(cluster.bench_temp_dir, ignore_errors=True)


@dataclass(frozen=True)
class Target:
    """One same-run target: ``ratio`` (rlinf over its baseline) must be ``op`` ``bound``."""

    measure: str
    ratio: float
    op: str  # "<=" or ">="
    bound: float

    @property
    def met(self) -> bool:
        return self.ratio <= self.bound if self.op == "<=" else self.ratio >= self.bound

    def line(self) -> str:
        return f"TARGET {'met   ' if self.met else 'MISSED'} {self.measure}: {self.ratio:.2f} (target {self.op} {self.bound})"


def add_run_options(parser, **smoke_values) -> None:
    """``--smoke`` (tiny sizes: ``smoke_values`` become the defaults) and ``--check``."""
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: proves the benchmark runs")
    parser.add_argument("--check", action="store_true", help="exit with status 1 when a same-run target is missed")
    parser.set_defaults(_smoke_values=smoke_values)


def parse(parser, argv):
    """Parse ``argv``; with ``--smoke``, options the user did not give take their smoke values."""
    args = parser.parse_args(argv)
    if args.smoke:
        given = {a.split("=")[0] for a in (argv or []) if a.startswith("--")}
        for key, value in args._smoke_values.items():
            if f"--{key}" not in given:
                setattr(args, key, value)
    return args


def report_targets(targets: Sequence[Target]) -> list:
    """Print one line per target; returns the missed ones."""
    for t in targets:
        print(t.line(), flush=True)
    return [t for t in targets if not t.met]


def median_time(fn: Callable[[], None], repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence]) -> str:
    cells = [list(map(str, header))] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(cells[0], widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells[1:]]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _fmt(value) -> str:
    if isinstance(value, float):
        if value == 0 or abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 1:
            return f"{value:.2f}"
        return f"{value:.3g}"
    return str(value)


def save_plot(name: str, title: str, *panels: dict) -> str:
    """Write the plot ``name`` (``RESULTS/name.png``) and its data (``RESULTS/name.json``); print and return the PNG's path.

    Every benchmark's plot goes through here, so all share the look of
    ``plots.py`` (one unit per panel, legends outside the data, fonts readable
    in the docs) and can be redrawn from the JSON without running again.

    Args:
        name: the plot's name (the benchmark's).
        title: the figure's title.
        panels: one or more panels, made by ``plots.bar`` or ``plots.line``.

    Raises:
        ValueError: a panel breaks a rule of ``plots.check_spec`` (a y label without its unit, for one).
    """
    import plots

    path = plots.save(name, {"title": title, "panels": list(panels)}, RESULTS)
    print(f"plot written to {path}")
    return path


def save_bar_plot(name: str, title: str, labels: Sequence[str], series: dict, ylabel: str, log: bool = False) -> str:
    """One panel of bars: ``labels`` on the x axis, one bar per series at each; see ``save_plot``.

    Args:
        name: the plot's name.
        title: the figure's title.
        labels: the x axis's categories.
        series: legend label -> one value per category, all in the unit of ``ylabel``.
        ylabel: the quantity and its unit in parentheses, e.g. ``"bandwidth (GB/s)"``.
        log: a logarithmic y axis.

    Raises:
        ValueError: as ``save_plot``.
    """
    import plots

    return save_plot(name, title, plots.bar(list(labels), series, ylabel, log=log))
