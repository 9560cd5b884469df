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

from user_env import user_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
MPIEXEC = shutil.which("mpiexec", path=BIN + os.pathsep + os.environ.get("PATH", ""))

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None or MPIEXEC is None,
    reason="needs mpi4py and an mpiexec (pip install mpi4py mpich)",
)


def _env(**extra) -> dict:
    """A user's shell (none of hatch.toml's env-vars: ``python -m rlinf.mpi`` is a command users run; a
    suite run under MPI gets the suite's settings from tests/conftest.py) with the MPI of this environment."""
    env = user_env(PYTHONUNBUFFERED="1", **extra)
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


def gone_within(marker: str, seconds: float = 1.0) -> list:
    """``leftovers(marker)``, polled until there are none or ``seconds`` have passed: a rank that has not
    exited ``seconds`` after its job ended is still found, and one already gone costs no fixed sleep."""
    deadline = time.monotonic() + seconds
    while True:
        found = leftovers(marker)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


def program(tmp_path, body: str) -> str:
    path = tmp_path / "program.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.mark.timeout(900)
def test_core_channel_and_conformance_suites_under_mpi(tmp_path):
    from conformance_counts import assert_class_ran_whole_kit, junit_outcomes, kit_tests
    from launcher_marks import MPI_ENDS_JOB, RAY_RECORDS
    from test_conformance_mpi import NOT_IN_JOB
    from rlinf.testing import LauncherConformance, TransportConformance

    # channels live as long as the program, one rank each: the suites create about a dozen
    suites = ["tests/test_groups.py", "tests/test_group_errors.py", "tests/test_p2p.py", "tests/test_channel.py",
              "tests/test_conformance_mpi.py", "tests/test_rlinf_attach.py", "tests/test_class_identity.py"]
    report = tmp_path / "mpi-suites.xml"
    code, out, took = mpirun(24, ["-m", "pytest", *suites, "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                                  f"--junitxml={report}"], timeout=840, RLINF_TEST_LAUNCHER="mpi")
    assert code == 0, out[-6000:]
    outcomes = junit_outcomes(report)
    # the conformance kit: every test that can run inside a job ran and passed, none skipped
    assert_class_ran_whole_kit(outcomes, "TestMpiTransport", kit_tests(TransportConformance) - NOT_IN_JOB["TestMpiTransport"])
    assert_class_ran_whole_kit(outcomes, "TestMpiLauncher", kit_tests(LauncherConformance) - NOT_IN_JOB["TestMpiLauncher"])
    assert outcomes.get(("tests.test_conformance_mpi", "test_channels_and_point_to_point_travel_over_mpi")) == "passed"
    # the other suites: nothing failed, each ran tests, and a skip is only ever for a documented reason
    allowed = (MPI_ENDS_JOB, "inspects the cpu transport's internals", RAY_RECORDS)
    for suite in suites[:-1]:
        module = suite[:-3].replace("/", ".")
        mine = {k: o for k, o in outcomes.items() if k[0] == module or k[0].startswith(module + ".")}
        passed = sum(o == "passed" for o in mine.values())
        assert passed >= len(mine) // 2 and passed > 0, f"{suite}: only {passed} of {len(mine)} passed under MPI"
        odd = {k: o for k, o in mine.items() if o != "passed" and not any(r in o for r in allowed)}
        assert not odd, f"{suite}: {odd}"
    print(f"{len(outcomes)} tests under MPI, {sum(o == 'passed' for o in outcomes.values())} passed ({took:.0f} s)")


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
    assert not gone_within("--serve"), "spawned worker ranks outlived their driver"
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
    assert "REFUSED: group 'too_big' needs 3 worker ranks but only 2 are free" in out and "mpiexec -n 4" in out
    assert "RANKS [0, 1]" in out  # nothing was left half-started: both ranks were still free
    assert took < 60 and not leftovers(path)


def test_a_slow_launch_says_how_many_workers_started(tmp_path):
    """A launch whose constructors take long reports them started out of total, as on Ray."""
    path = program(tmp_path, """
        import time
        from rlinf.scheduler import Cluster, Worker

        class Slow(Worker):
            def __init__(self):
                super().__init__()
                time.sleep(3)

            def hi(self):
                return self._rank

        print("RANKS", Slow.create_group().launch(Cluster(), name="slow").hi().wait())
    """)
    code, out, took = mpirun(2, [path], timeout=90, RLINF_PROGRESS_AFTER="1", RLINF_PROGRESS_EVERY="1")
    assert code == 0, out
    assert "[rlinf] group slow: 0 of 1 worker(s) started" in out, out
    assert "[rlinf] group slow: 1 worker(s) started after" in out and "RANKS [0]" in out, out


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
def test_a_wait_in_progress_when_the_program_ends_does_not_abort_the_rank(tmp_path):
    """A thread still polling an MPI request when the program returns: the rank finalizes cleanly
    (a test after MPI_Finalize aborted it: "Attempting to use an MPI routine ... after finalizing")."""
    path = program(tmp_path, """
        import threading, time
        from mpi4py import MPI
        from rlinf.scheduler import Cluster
        from rlinf.mpi.polling import wait_for

        Cluster(launcher="mpi")
        ended = []

        def wait():  # a message that never comes, polled with a deadline far away
            try:
                wait_for(lambda: MPI.COMM_WORLD.Iprobe(source=1, tag=4242), time.monotonic() + 60)
            except ConnectionError as exc:
                ended.append(str(exc))

        for _ in range(16):
            threading.Thread(target=wait, daemon=True).start()
        time.sleep(0.3)
        print("RETURNING", flush=True)
    """)
    for _ in range(3):  # a race: each run lost it about half the time
        code, out, took = mpirun(2, [path], timeout=100)
        assert "RETURNING" in out, out
        assert code == 0 and "after finalizing" not in out, out
        assert took < 30, out


@pytest.mark.timeout(120)
def test_a_worker_that_dies_ends_the_job(tmp_path):
    path = program(tmp_path, KILLS_A_WORKER)
    code, out, took = mpirun(3, [path], timeout=100)
    assert "KILLING" in out and "NOT REACHED" not in out
    assert code != 0 and took < 60, out
    assert not gone_within(path)


@pytest.mark.timeout(120)
def test_a_worker_that_dies_in_spawn_mode_ends_the_driver_too(tmp_path):
    path = program(tmp_path, KILLS_A_WORKER)
    start = time.monotonic()
    # its own session: MPICH ends a failed spawned job by killing the driver's whole process group
    proc = subprocess.run([sys.executable, path], cwd=ROOT, timeout=100, env=_env(RLINF_LAUNCHER="mpi", RLINF_MPI_SLOTS="2"),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    assert "KILLING" in proc.stdout and "NOT REACHED" not in proc.stdout
    assert proc.returncode != 0 and time.monotonic() - start < 60, proc.stdout
    assert not gone_within("--serve")


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
    # the hung call's rank exits RLINF_MPI_EXIT_GRACE after the program ended (2 s here, 10 by default)
    code, out, took = mpirun(3, [path], timeout=100, RLINF_MPI_EXIT_GRACE="2")
    assert code != 0 and "program failed on purpose" in out
    assert "a call is still running 2 s after the program ended; exiting" in out, out
    assert took < 60, out
    assert not gone_within(path)


#: a worker blocked in an MPI receive whose sender dies; also a peer waiting on an MPI send to it
PEER_DIES_DURING_RECV = """
        import os, signal, time
        from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

        class W(Worker):
            def pid(self):
                return os.getpid()
            def talk(self):
                name = self.worker_group_name
                if self._rank == 0:
                    self.send("hello", name, 1, timeout=30)  # the link is up
                    print("RECEIVING", flush=True)
                    return self.recv(name, 1, timeout=120)  # rank 1 dies instead of answering
                assert self.recv(name, 0, timeout=30) == "hello"
                time.sleep(1.0)
                os.kill(os.getpid(), signal.SIGKILL)

        g = W.create_group().launch(Cluster(), NodePlacementStrategy([0, 0]), name="peer_dies")
        print("PIDS", *g.pid().wait(), flush=True)
        g.talk().wait()
        print("NOT REACHED")
"""


@pytest.mark.timeout(150)
def test_a_peer_dying_during_an_mpi_receive_ends_the_job_promptly(tmp_path):
    """The MPI transport's peer death: MPI ends the job, so no surviving rank waits out its 120 s receive."""
    path = program(tmp_path, PEER_DIES_DURING_RECV)
    code, out, took = mpirun(3, [path], timeout=120)
    assert "RECEIVING" in out and "NOT REACHED" not in out, out[-4000:]
    assert code != 0, out[-4000:]
    assert took < 60, f"the job took {took:.0f} s to end after a rank died (the receive's timeout is 120 s)"
    pids = [int(p) for p in next(line for line in out.splitlines() if line.startswith("PIDS")).split()[1:]]
    assert not gone_within(path), "a rank outlived the job"
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.timeout(300)
def test_spawn_mode_default_slots_is_max_of_4_and_the_cpu_count(tmp_path):
    path = program(tmp_path, """
        import os
        from rlinf.mpi.runtime import world
        from rlinf.scheduler import Cluster

        Cluster()
        print("WORLD", world().comm.Get_size(), "CPUS", os.cpu_count(), flush=True)
    """)
    env = _env(RLINF_LAUNCHER="mpi")
    env.pop("RLINF_MPI_SLOTS", None)
    proc = subprocess.run([sys.executable, path], cwd=ROOT, timeout=240, env=env, start_new_session=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("WORLD"))
    world_size, cpus = int(line.split()[1]), int(line.split()[3])
    assert world_size == 1 + max(4, cpus), line  # the driver plus the spawned worker ranks
    assert not gone_within("--serve")


#: rank 1 receives 5 messages that each arrive 0.3 s after it starts waiting; prints its CPU seconds
SPIN_PROGRAM = """
        import time
        from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

        class W(Worker):
            def run(self):
                name = self.worker_group_name
                if self._rank == 0:
                    for _ in range(6):
                        time.sleep(0.3)
                        self.send("tick", name, 1, timeout=60)
                    return None
                self.recv(name, 0, timeout=60)  # the link is up before measuring
                start = time.process_time()
                for _ in range(5):
                    self.recv(name, 0, timeout=60)
                return time.process_time() - start

        g = W.create_group().launch(Cluster(), NodePlacementStrategy([0, 0]), name="spin")
        print("CPU", g.run().wait()[1], flush=True)
"""


@pytest.mark.timeout(300)
def test_rlinf_mpi_spin_us_sets_how_long_a_waiting_rank_spins(tmp_path):
    path = program(tmp_path, SPIN_PROGRAM)
    cpu = {}
    for spin in ("0", "1000000"):  # never spin; spin up to a second (longer than each wait)
        code, out, _ = mpirun(3, [path], timeout=120, RLINF_MPI_SPIN_US=spin)
        assert code == 0, out[-4000:]
        cpu[spin] = float(next(line for line in out.splitlines() if line.startswith("CPU")).split()[1])
    # five waits of 0.3 s: spinning burns most of that even on a busy machine; sleeping between tests does not
    assert cpu["1000000"] > 0.3, cpu
    assert cpu["0"] < cpu["1000000"] / 3, cpu
    assert not leftovers(path)
