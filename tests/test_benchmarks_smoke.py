"""Every benchmark runs, in its smoke mode (tiny sizes), so none can rot.

The numbers of a smoke run mean nothing and are not checked; what is checked
is that the benchmark ran end to end, printed its table and its targets, and
wrote its plot.  ``--check`` (exit status 1 on a missed target) is tested on
its decision alone: real targets are for quiet machines, not CI.  The runs go
three at a time, as a user with several benchmarks to try would start them.
"""

import functools
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(ROOT, "benchmarks", "run.py")
TABLE_TITLES = {
    "group": "Group benchmark",
    "p2p": "Point-to-point between two workers",
    "channel": "Channel vs ray.util.queue.Queue",
    "mpi": "rlinf over MPI against raw mpi4py",
    "trace": "Tracing overhead",
    "weights": "Weight sync",
    "weights-hosts": "Weight sync across hosts",
    "gloo": "torch-gloo against the cpu transport",
    "scale": "Scale benchmark",
    "routed": "Routed env <-> rollout exchange",
}
TARGETS = {"group": 3, "p2p": 1, "channel": 7, "mpi": 1, "trace": 2, "weights": 8, "weights-hosts": 2, "gloo": 0,
           "scale": 2, "routed": 1}  # targets a smoke run (no 256 MiB size) reports


LONGEST_FIRST = ("weights-hosts", "scale", "channel", "weights")  # started first, so the last to finish is a short one
CONCURRENT = 3  # smoke runs at a time: most of a run is spent waiting on Ray's start, so 3 share 2 cores well


@functools.lru_cache(maxsize=None)
def _skip_reason(name):
    """Why benchmark ``name`` cannot run on this machine, or None."""
    if name == "mpi":
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            return "the mpi benchmark needs mpi4py and mpiexec"
    if name == "weights-hosts":
        from netns import unavailable_reason

        reason = unavailable_reason()
        if reason:
            return f"the cross-host weights benchmark needs network namespaces: {reason}"
    return None


def _smoke(name, results):
    """Run ``benchmarks/run.py name --smoke`` with plots written under ``results``; its exit status and output."""
    env = {k: v for k, v in os.environ.items() if k not in ("RLINF_LAUNCHER", "RLINF_TEST_LAUNCHER", "RAY_ADDRESS")}
    env.update(RLINF_BENCH_RESULTS=str(results), PYTHONUNBUFFERED="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.Popen([sys.executable, RUN, name, "--smoke"], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = proc.communicate(timeout=280)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the benchmark and the Ray it started
        out, _ = proc.communicate(timeout=30)
        return None, out
    return proc.returncode, out


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    """Every runnable benchmark's smoke run, started CONCURRENT at a time: name -> (future, results folder)."""
    pool = ThreadPoolExecutor(max_workers=CONCURRENT, thread_name_prefix="smoke")
    runs = {}
    for name in list(LONGEST_FIRST) + [n for n in sorted(TABLE_TITLES) if n not in LONGEST_FIRST]:
        if _skip_reason(name) is None:
            results = tmp_path_factory.mktemp(f"bench-{name}")
            runs[name] = (pool.submit(_smoke, name, results), results)
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(TABLE_TITLES))
def test_benchmark_smoke_run(name, smoke_runs):
    reason = _skip_reason(name)
    if reason:
        pytest.skip(reason)
    future, results = smoke_runs[name]
    returncode, out = future.result(timeout=850)  # each run is bounded at 280 s; at most 3 runs queue ahead of it
    assert returncode == 0, f"exit status {returncode} (None: killed after 280 s)\n" + out[-5000:]
    assert TABLE_TITLES[name] in out, out[-5000:]
    lines = [line for line in out.splitlines() if line.startswith("TARGET ")]
    assert len(lines) == TARGETS[name], out[-3000:]
    assert os.path.exists(results / f"{name}.png"), "the plot was not written"


def test_check_exits_non_zero_only_when_a_target_is_missed():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        from common import Target
        from run import exit_status
    finally:
        sys.path.pop(0)
    met, missed = Target("a", 1.0, "<=", 1.25), Target("b", 0.5, ">=", 2.0)
    assert met.met and not missed.met
    assert Target("c", 2.0, ">=", 2.0).met and not Target("d", 1.26, "<=", 1.25).met
    assert exit_status([], check=True) == 0
    assert exit_status([missed], check=True) == 1
    assert exit_status([missed], check=False) == 0  # without --check a miss is only printed


def test_unknown_benchmark_is_a_usage_error():
    proc = subprocess.run([sys.executable, RUN, "nope"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage: run.py" in proc.stderr
