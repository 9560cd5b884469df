"""The MPI launcher and transport, on real ``mpiexec`` jobs.

Each test starts a job as a subprocess (ranks are processes: rank 0 runs a
program, the others host workers) and checks what a user sees: output, exit
status, how long it took, and that no rank outlives the job.  The core,
channel and conformance suites run inside one job as the program of
``python -m rlinf.mpi -m pytest``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
MPIEXEC = shutil.which("mpiexec", path=BIN + os.pathsep + os.environ.get("PATH", ""))

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
    reason="needs mpi4py and an mpiexec (pip install mpi4py mpich)",
)


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RLINF_LAUNCHER", "RLINF_TEST_LAUNCHER")}
    env.update(UCX_NET_DEVICES="lo", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1", **extra)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    return env


def mpirun(n: int, args: list, timeout: float, **env) -> tuple[int, str, float]:
    start = time.monotonic()
    proc = subprocess.run([MPIEXEC, "-n", str(n), sys.executable, "-m", "rlinf.mpi", *args], cwd=ROOT,
                          env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return proc.returncode, proc.stdout, time.monotonic() - start


def leftovers(marker: str) -> list:
    """Processes still running whose command line mentions ``marker``."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.info["cmdline"] and any(marker in part for part in p.info["cmdline"]) and p.pid != os.getpid():
                found.append((p.pid, " ".join(p.info["cmdline"])))
        except psutil.Error:
            pass
    return found


def program(tmp_path, body: str) -> str:
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.mark.timeout(900)
def test_core_channel_and_conformance_suites_under_mpi():
    # channels live as long as the program, one rank each: the suites create about a dozen
    suites = ["tests/test_groups.py", "tests/test_group_errors.py", "tests/test_p2p.py", "tests/test_channel.py",
              "tests/test_conformance_mpi.py"]
    code, out, took = mpirun(24, ["-m", "pytest", *suites, "-q", "-p", "no:cacheprovider", "-o", "addopts="],
                             timeout=840, RLINF_TEST_LAUNCHER="mpi")
    summary = [line for line in out.splitlines() if " passed" in line or " failed" in line or "error" in line.lower()]
    assert code == 0, out[-6000:]
    assert summary and "failed" not in summary[-1], out[-6000:]
    print(summary[-1], f"({took:.0f} s)")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("example", ["worker_group.py", "communication.py", "timing.py"])
def test_seed_examples_unchanged_under_mpiexec(example):
    code, out, _ = mpirun(5, [f"examples/{example}"], timeout=300)
    assert code == 0, out[-4000:]
    assert not leftovers(f"examples/{example}")


@pytest.mark.timeout(300)
def test_spawn_mode_from_plain_python(tmp_path):
    """RLINF_LAUNCHER=mpi in a plain python process spawns its worker ranks."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "examples/communication.py"], cwd=ROOT, timeout=240,
                          env=_env(RLINF_LAUNCHER="mpi", RLINF_MPI_SLOTS="4"), start_new_session=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "replies: ['Hello from RecvWorker Rank 0!', 'Hello from RecvWorker Rank 1!']" in proc.stdout
    time.sleep(1.0)
    assert not leftovers("--serve"), "spawned worker ranks outlived their driver"
    print(f"spawn mode: {time.monotonic() - start:.1f} s")


@pytest.mark.timeout(120)
def test_spawn_mode_without_mpiexec_says_why(tmp_path):
    env = _env(RLINF_LAUNCHER="mpi")
    env["PATH"] = "/usr/bin:/bin" if not shutil.which("mpiexec", path="/usr/bin:/bin") else str(tmp_path)
    proc = subprocess.run([sys.executable, "examples/timing.py"], cwd=ROOT, timeout=60, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode != 0
    assert "needs the MPI library's mpiexec on PATH" in proc.stdout and "mpiexec -n N python -m rlinf.mpi" in proc.stdout


@pytest.mark.timeout(120)
def test_more_workers_than_ranks_is_an_error_before_anything_starts(tmp_path):
    path = program(tmp_path, """
        from rlinf.scheduler import Cluster, NodePlacementStrategy, PlacementError, Worker

        class W(Worker):
            def hi(self):
                return self._rank

        try:
            W.create_group().launch(Cluster(), NodePlacementStrategy([0, 0, 0]), name="too_big")
        except PlacementError as exc:
            print("REFUSED:", exc)
        small = W.create_group().launch(Cluster(), NodePlacementStrategy([0, 0]), name="fits")
        print("RANKS", small.hi().wait())
    """)
    code, out, took = mpirun(3, [path], timeout=90)
    assert code == 0, out
    assert "REFUSED: group 'too_big' needs 3 worker rank(s) on node 0 but only 2" in out and "mpiexec -n 4" in out
    assert "RANKS [0, 1]" in out  # nothing was left half-started: both ranks were still free
    assert took < 60 and not leftovers(path)


#: a program that kills one of its workers during a call and waits on that call
KILLS_A_WORKER = """
        import os, signal, time
        from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

        class W(Worker):
            def pid(self):
                return os.getpid()
            def sleep(self, s):
                time.sleep(s)

        g = W.create_group().launch(Cluster(), NodePlacementStrategy([0, 0]), name="doomed")
        pids = g.pid().wait()
        handle = g.sleep(600)
        print("KILLING", pids[1], flush=True)
        os.kill(pids[1], signal.SIGKILL)
        handle.wait()
        print("NOT REACHED")
"""


@pytest.mark.timeout(120)
def test_a_worker_that_dies_ends_the_job(tmp_path):
    path = program(tmp_path, KILLS_A_WORKER)
    code, out, took = mpirun(3, [path], timeout=100)
    assert "KILLING" in out and "NOT REACHED" not in out
    assert code != 0 and took < 60, out
    time.sleep(1.0)
    assert not leftovers(path)


@pytest.mark.timeout(120)
def test_a_worker_that_dies_in_spawn_mode_ends_the_driver_too(tmp_path):
    path = program(tmp_path, KILLS_A_WORKER)
    start = time.monotonic()
    # its own session: MPICH ends a failed spawned job by killing the driver's whole process group
    proc = subprocess.run([sys.executable, path], cwd=ROOT, timeout=100, env=_env(RLINF_LAUNCHER="mpi", RLINF_MPI_SLOTS="2"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert "KILLING" in proc.stdout and "NOT REACHED" not in proc.stdout
    assert proc.returncode != 0 and time.monotonic() - start < 60, proc.stdout
    time.sleep(1.0)
    assert not leftovers("--serve")


@pytest.mark.timeout(120)
def test_program_error_and_a_hung_worker_end_every_rank(tmp_path):
    path = program(tmp_path, """
        import time
        from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

        class W(Worker):
            def hang(self):
                time.sleep(3600)

        g = W.create_group().launch(Cluster(), NodePlacementStrategy([0]), name="hung")
        g.hang()  # never waited for
        raise SystemExit("program failed on purpose")
    """)
    code, out, took = mpirun(3, [path], timeout=100)
    assert code != 0 and "program failed on purpose" in out
    assert took < 60, out
    time.sleep(1.0)
    assert not leftovers(path)
