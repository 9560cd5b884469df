"""RLinf 0.3.0 itself as a baseline column: its own virtual environment and a bounded run of one of its scripts.

``--with-rlinf`` on a benchmark calls ``run_rlinf(script, args, timeout)``,
which runs ``benchmarks/rlinf_side/<script>.py`` (the same work as the
benchmark, written against RLinf's API) with the Python of a virtual
environment holding RLinf 0.3.0 from PyPI, and returns the JSON object the
script prints on its last line.  The environment is built on first use and
reused afterwards: ``$RLINF_BENCH_VENV``, else ``benchmarks/.rlinf-venv``
(ignored by git).  It never touches the project's environment: both packages
are the ``rlinf`` namespace.

What goes in it: the Python running this module (``python -m venv``),
``torch==2.13.0`` (the one release this machine holds as a local wheel: any
other would be a multi-gigabyte download, so it is pinned for every later step
too), the Ray release of the project's environment, ``rlinf==0.3.0`` without its
dependencies (its list pulls in wandb, datasets, accelerate and more that its
scheduler never imports), and the few packages ``rlinf.scheduler`` imports
(``SCHEDULER_DEPS``).

Each run gets its own Ray temp dir and process group: RLinf's ``Cluster``
starts a Ray of its own, which the run's end stops, checking that no process
of that temp dir (raylet, gcs_server, workers) is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
SIDE = os.path.join(HERE, "rlinf_side")
RLINF_VERSION = "0.3.0"
TORCH_VERSION = "2.13.0"
#: what ``rlinf.scheduler`` 0.3.0 imports besides torch and Ray (found by importing it and running the scripts)
SCHEDULER_DEPS = ["omegaconf", "numpy"]
#: seconds a build may take (pip downloads Ray: about 100 MB)
BUILD_TIMEOUT = 1800.0


class RLinfBaselineError(RuntimeError):
    """Building RLinf's environment or running one of its scripts failed; the message says which and why."""


def venv_dir() -> str:
    """Where RLinf's virtual environment lives: ``$RLINF_BENCH_VENV``, else ``benchmarks/.rlinf-venv``."""
    return os.path.abspath(os.environ.get("RLINF_BENCH_VENV") or os.path.join(HERE, ".rlinf-venv"))


def _python(venv: str) -> str:
    return os.path.join(venv, "bin", "python")


def _spec() -> dict:
    """What the environment must hold; a built one records it, and one that records anything else is rebuilt.

    Raises:
        RLinfBaselineError: this Python has no Ray (run the benchmark in the project's environment).
    """
    try:
        ray_version = metadata.version("ray")
    except metadata.PackageNotFoundError:
        raise RLinfBaselineError(f"{sys.executable} has no Ray, whose release RLinf's environment takes: "
                                 "run the benchmark in the project's environment (hatch run bench ...)") from None
    return {"python": sys.version.split()[0], "torch": TORCH_VERSION, "ray": ray_version,
            "rlinf": RLINF_VERSION, "deps": SCHEDULER_DEPS}


def _step(what: str, cmd: list, log, timeout: float) -> None:
    """Run one build step, its output into ``log``; raises ``RLinfBaselineError`` naming the step."""
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    try:
        done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, env=_clean_env())
    except subprocess.TimeoutExpired:
        raise RLinfBaselineError(f"building RLinf's environment: {what} took over {timeout:.0f} s (log: {log.name})")
    if done.returncode:
        raise RLinfBaselineError(f"building RLinf's environment: {what} failed with status {done.returncode} "
                                 f"(log: {log.name})")


def ensure_venv() -> str:
    """RLinf's environment, built if missing or built for another spec; returns its Python.

    Raises:
        RLinfBaselineError: a build step failed or timed out (the message names it and the log file).
    """
    import fcntl

    venv, spec = venv_dir(), _spec()
    marker = os.path.join(venv, "rlinf-bench.json")
    os.makedirs(os.path.dirname(venv), exist_ok=True)
    with open(venv + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two benchmarks started at once build it once
        with contextlib.suppress(OSError, ValueError):
            with open(marker) as f:
                if json.load(f) == spec:
                    return _python(venv)
        shutil.rmtree(venv, ignore_errors=True)
        print(f"building RLinf {RLINF_VERSION}'s environment in {venv} (once; a few minutes)", flush=True)
        deadline = time.monotonic() + BUILD_TIMEOUT
        with open(venv + ".build.log", "w") as log, tempfile.NamedTemporaryFile("w", suffix=".txt") as pins:
            pins.write(f"torch=={TORCH_VERSION}\n")  # any other torch would be a download of gigabytes
            pins.flush()
            pip = [_python(venv), "-m", "pip", "install", "--disable-pip-version-check", "-c", pins.name]
            left = lambda: max(1.0, deadline - time.monotonic())  # noqa: E731
            _step("python -m venv", [sys.executable, "-m", "venv", venv], log, left())
            _step(f"pip install torch=={TORCH_VERSION}", pip + [f"torch=={TORCH_VERSION}"], log, left())
            _step(f"pip install ray=={spec['ray']}", pip + [f"ray=={spec['ray']}"], log, left())
            _step(f"pip install rlinf=={RLINF_VERSION} --no-deps", pip + ["--no-deps", f"rlinf=={RLINF_VERSION}"],
                  log, left())
            _step("pip install " + " ".join(SCHEDULER_DEPS), pip + SCHEDULER_DEPS, log, left())
            _step("import rlinf.scheduler", [_python(venv), "-c", "import rlinf.scheduler"], log, left())
        with open(marker, "w") as f:
            json.dump(spec, f)
        return _python(venv)


def _clean_env(extra: dict | None = None) -> dict:
    """This process's environment without what points at the project's environment or another Ray."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "RAY_ADDRESS", "PIP_REQUIRE_VIRTUALENV")
           and not k.startswith("RLINF_")}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled",
               RAY_DEDUP_LOGS="0", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    env.update(extra or {})
    return env


def _processes_of(temp_dir: str) -> list[int]:
    """Pids of this user's processes whose command line names ``temp_dir`` (Ray's servers and workers of it)."""
    found, me = [], os.geteuid()
    needle = temp_dir.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != me:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if needle in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _stop(proc: subprocess.Popen, temp_dir: str) -> list[int]:
    """Kill the run's process group and every process of its Ray temp dir; returns pids still alive after 10 s."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the script and what it started (start_new_session: pgid == pid)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
    deadline = time.monotonic() + 10
    left = _processes_of(temp_dir)
    while left and time.monotonic() < deadline:
        for pid in left:  # Ray's servers may have left the group (its reaper calls setpgrp)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        left = _processes_of(temp_dir)
    return left


#: what Ray prints when its node did not come up in time (its agents start slowly on a loaded machine): worth a retry
_SLOW_START = "timed out during startup"


def run_rlinf(script: str, args: dict, timeout: float = 900.0, attempts: int = 2) -> dict:
    """Run ``rlinf_side/<script>.py`` with RLinf 0.3.0 and return the JSON object it prints last.

    The script runs in RLinf's environment (built on first use, see ``ensure_venv``), in a process
    group of its own, on loopback, with a Ray temp dir of its own; afterwards the group and every
    process of that temp dir are killed, and the temp dir removed.

    Args:
        script: the script's name in ``benchmarks/rlinf_side`` without ``.py`` (``"group"``).
        args: its arguments (JSON-serialisable); it reads them as one JSON argument.
        timeout: seconds the script may run (each attempt).
        attempts: runs tried when Ray's node did not start in time (and only then).

    Returns:
        The script's result.

    Raises:
        RLinfBaselineError: the environment could not be built, or the script failed, timed out,
            printed no JSON, or left Ray processes that would not die (the message says which).
    """
    python = ensure_venv()
    for attempt in range(attempts):
        try:
            return _run_once(python, script, args, timeout)
        except RLinfBaselineError as e:
            if _SLOW_START not in str(e) or attempt == attempts - 1:
                raise
            print(f"RLinf's {script} run: Ray's node did not start in time; trying again", flush=True)
    raise AssertionError("unreachable")


def _run_once(python: str, script: str, args: dict, timeout: float) -> dict:
    """One run of ``run_rlinf``."""
    temp_dir = tempfile.mkdtemp(prefix="rlb")  # short: Ray's socket paths must fit in 107 bytes
    log_dir = os.environ.get("RLINF_BENCH_RESULTS") or os.path.join(HERE, "results")
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, f"rlinf-{script}.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([python, os.path.join(SIDE, f"{script}.py"), json.dumps(args)], cwd=SIDE,
                                stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
                                env=_clean_env({"RLINF_BENCH_RAY_TMP": temp_dir}))
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            out = None
        finally:
            left = _stop(proc, temp_dir)
            shutil.rmtree(temp_dir, ignore_errors=True)
    if left:
        raise RLinfBaselineError(f"RLinf's {script} run left processes of its Ray that would not die: {left}")
    if out is None:
        raise RLinfBaselineError(f"RLinf's {script} run took over {timeout:.0f} s (log: {log_path})")
    last = (out.strip().splitlines() or [""])[-1]
    try:
        result = json.loads(last)
    except ValueError:
        result = None
    if proc.returncode or not isinstance(result, dict):
        raise RLinfBaselineError(f"RLinf's {script} run failed (status {proc.returncode}); last lines of "
                                 f"{log_path}:\n" + _tail(log_path))
    return result


def _tail(path: str, lines: int = 15) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def try_run_rlinf(script: str, args: dict, timeout: float = 900.0) -> dict | None:
    """``run_rlinf``, or ``None`` after printing why it failed (the benchmark's own columns still print)."""
    try:
        return run_rlinf(script, args, timeout)
    except RLinfBaselineError as e:
        print(f"RLinf baseline not available: {e}", file=sys.stderr, flush=True)
        return None


def add_option(parser) -> None:
    """``--with-rlinf`` and ``--rlinf-timeout`` on a benchmark's parser."""
    parser.add_argument("--with-rlinf", action="store_true",
                        help="also run the same work with RLinf 0.3.0 (its own environment, built on first use)")
    parser.add_argument("--rlinf-timeout", type=float, default=1800.0, help="seconds RLinf's run may take")


if __name__ == "__main__":  # python benchmarks/rlinf_baseline.py SCRIPT '{"json": "args"}'
    print(json.dumps(run_rlinf(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})))
