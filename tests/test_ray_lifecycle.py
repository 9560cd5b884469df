"""Group lifecycle on Ray: stopping frees resources, groups outlive dropped handles
but not their driver, name reservation is atomic, and async waits report failures fast."""

import asyncio
import concurrent.futures
import gc
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from launcher_marks import TEST_LAUNCHER
from rlinf.scheduler import Worker, WorkerGroup
from rlinf.scheduler.base.errors import GroupNameError, WorkerDiedError, WorkerMethodError
from rlinf.scheduler.transports.async_work import AsyncWork

needs_ray = pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="Ray lifecycle: starts Ray clusters or kills workers")
PROGRAM = os.path.join(os.path.dirname(__file__), "cluster_program.py")


class _FastSwitching:
    """Make the interpreter switch threads as often as it can, so that races show up."""

    def __enter__(self):
        self._old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)

    def __exit__(self, *exc):
        sys.setswitchinterval(self._old)


# -- AsyncWork.gather ------------------------------------------------------------------------
def test_gather_counts_completions_from_many_threads():
    """Works finished concurrently on many threads: the gathered work always completes, once."""
    threads_per_round, rounds = 8, 150
    pool = concurrent.futures.ThreadPoolExecutor(threads_per_round)
    try:
        with _FastSwitching():
            for r in range(rounds):
                futures = [concurrent.futures.Future() for _ in range(threads_per_round)]
                gathered = AsyncWork.gather([AsyncWork(f) for f in futures], value=r)
                barrier = threading.Barrier(threads_per_round)

                def finish(f):
                    barrier.wait(10)
                    f.set_result(None)

                list(pool.map(finish, futures))
                assert gathered.wait(timeout=10) == r  # a lost decrement leaves it pending: TimeoutError
    finally:
        pool.shutdown()


def test_gather_settles_once_when_works_fail_on_many_threads(caplog):
    """Works failing concurrently: the gathered work fails with one of their errors, and
    no completion callback trips over another (settling a future twice raises in the callback)."""
    import logging

    threads_per_round, rounds = 8, 150
    pool = concurrent.futures.ThreadPoolExecutor(threads_per_round)
    caplog.set_level(logging.ERROR, logger="concurrent.futures")
    try:
        with _FastSwitching():
            for _ in range(rounds):
                futures = [concurrent.futures.Future() for _ in range(threads_per_round)]
                gathered = AsyncWork.gather([AsyncWork(f) for f in futures])
                barrier = threading.Barrier(threads_per_round)

                def fail(i):
                    barrier.wait(10)
                    futures[i].set_exception(KeyError(i))

                list(pool.map(fail, range(threads_per_round)))
                with pytest.raises(KeyError):
                    gathered.wait(timeout=10)
    finally:
        pool.shutdown()
    assert not [r for r in caplog.records if "callback" in r.getMessage()], caplog.text[-2000:]


# -- registry reservation ------------------------------------------------------------------------
class _YieldingName(str):
    """A group name whose hashing lets other threads run, as a slow lookup (or a free-threaded
    interpreter) would: a registry that checks, then adds, lets two threads in between."""

    def __hash__(self):
        time.sleep(0)
        return str.__hash__(self)


def test_registry_reserve_is_atomic_under_racing_threads():
    """Many threads race to reserve each name in the registry's own (threaded) code: one wins per name."""
    from rlinf.ray.registry import Registry

    names, threads = [_YieldingName(f"g{i}") for i in range(200)], 8
    reg = Registry()
    wins: dict[str, int] = {str(n): 0 for n in names}
    lock = threading.Lock()
    barrier = threading.Barrier(threads)

    def racer():
        barrier.wait(10)
        for n in names:
            if reg.reserve(n):
                with lock:
                    wins[str(n)] += 1

    with _FastSwitching():
        ts = [threading.Thread(target=racer) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
    assert all(not t.is_alive() for t in ts)
    assert wins == {str(n): 1 for n in names}


class Tiny(Worker):
    def __init__(self):
        super().__init__()

    def pid(self):
        return os.getpid()

    def hello(self):
        return "hi"

    def fail_or_recv(self, how):
        if self._rank == 0:
            if how == "die":
                os._exit(1)
            raise ValueError("boom")
        return self.recv(self.worker_group_name, 0)


@needs_ray
def test_concurrent_reservations_through_the_registry_actor(cluster):
    """Threads racing through the real registry actor: exactly one reservation per name wins."""
    session = cluster.session
    names = [f"race_{uuid.uuid4().hex[:6]}_{i}" for i in range(40)]
    wins = {n: 0 for n in names}
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def racer():
        barrier.wait(30)
        for n in names:
            try:
                session.reserve_group(n)
            except GroupNameError:
                continue
            with lock:
                wins[n] += 1

    ts = [threading.Thread(target=racer) for _ in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    try:
        assert wins == {n: 1 for n in names}
    finally:
        for n in names:
            session.release_group(n)


@needs_ray
def test_concurrent_launches_of_one_name(cluster):
    name = f"one_{uuid.uuid4().hex[:6]}"
    results: list = []

    def launch():
        try:
            results.append(Tiny.create_group().launch(cluster, name=name))
        except GroupNameError as exc:
            results.append(exc)

    ts = [threading.Thread(target=launch) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(150)
    groups = [r for r in results if isinstance(r, WorkerGroup)]
    try:
        assert len(results) == 3 and len(groups) == 1, results
        assert groups[0].hello().wait() == ["hi"]
    finally:
        for g in groups:
            g.stop()


# -- groups live until stopped -------------------------------------------------------------------
@needs_ray
def test_group_outlives_its_dropped_handle(cluster):
    name = f"dropped_{uuid.uuid4().hex[:6]}"
    Tiny.create_group().launch(cluster, name=name)  # the handle is dropped at once
    gc.collect()
    time.sleep(2)  # Ray ends actors nobody holds within about a second
    group = WorkerGroup.from_group_name(Tiny, name)
    try:
        assert group.hello().wait(timeout=60) == ["hi"]
        assert group.worker_group_name == name and group.world_size == 1
        with pytest.raises(TypeError, match="Tiny"):
            WorkerGroup.from_group_name(Worker, name)
    finally:
        group.stop()
    with pytest.raises(GroupNameError, match="no group named"):
        WorkerGroup.from_group_name(Tiny, name)
    # the name is free again
    again = Tiny.create_group().launch(cluster, name=name)
    again.stop()


def _pid_gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@needs_ray
@pytest.mark.timeout(300)
def test_groups_stop_with_their_driver_on_an_external_cluster():
    """A driver joining a ``ray start`` cluster: its groups end when it exits, or when it is killed."""
    from ray_nodes import RayNodes

    with RayNodes() as nodes:
        nodes.start_head(num_cpus=2)
        done = nodes.run_driver(PROGRAM, "orphan", timeout=150)
        assert "orphan OK" in done.stdout, done.stdout[-2000:] + done.stderr[-4000:] + nodes.logs()
        pid = int(done.stdout.split("WORKER_PID=")[1].split()[0])
        assert _pid_gone(pid, 60), f"worker {pid} outlived its driver's exit"

        env = dict(nodes.env, RAY_ADDRESS=nodes.address)
        driver = subprocess.Popen([sys.executable, PROGRAM, "orphan", "hold"], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        try:
            lines = []
            for line in driver.stdout:
                lines.append(line)
                if line.startswith("HOLDING"):
                    break
            out = "".join(lines)
            assert "WORKER_PID=" in out, out + driver.stderr.read()[-4000:] if driver.poll() is not None else out
            pid = int(out.split("WORKER_PID=")[1].split()[0])
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait(30)
            assert _pid_gone(pid, 90), f"worker {pid} outlived its killed driver"
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, signal.SIGKILL)
                driver.wait(30)


@needs_ray
@pytest.mark.timeout(300)
def test_stopping_a_group_frees_its_gpus_for_the_next_launch():
    """A 4-GPU ``ray start`` cluster (no real GPUs needed): stop, then relaunch on the same GPUs at once."""
    from ray_nodes import RayNodes

    with RayNodes() as nodes:
        nodes.start_head(num_cpus=2, num_gpus=4)
        done = nodes.run_driver(PROGRAM, "gpus", timeout=200)
        assert "gpus OK" in done.stdout, done.stdout[-2000:] + done.stderr[-5000:] + nodes.logs()


# -- async_wait after a failure -------------------------------------------------------------------
@needs_ray
@pytest.mark.parametrize("failure", ["raise", "die"])
def test_async_wait_reports_a_failure_as_fast_as_wait(launch, failure):
    """Rank 0 fails while rank 1 blocks in recv from it: ``await result`` reports rank 0's failure
    within the error grace period (not at the communication timeout), ranked as ``wait()`` ranks it."""
    from rlinf.scheduler import NodePlacementStrategy

    group = launch(Tiny, placement=NodePlacementStrategy([0, 0]))

    async def run():
        result = group.fail_or_recv(failure)
        start = time.monotonic()
        with pytest.raises((WorkerMethodError, WorkerDiedError)) as info:
            await result.async_wait()
        return time.monotonic() - start, info.value

    elapsed, err = asyncio.run(asyncio.wait_for(run(), 120))
    assert err.rank == 0, err
    expected = WorkerMethodError if failure == "raise" else WorkerDiedError
    assert type(err) is expected, err
    assert elapsed < 30, elapsed  # the grace period is 2 s; the recv would wait 1800 s
