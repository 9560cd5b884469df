"""Async workers: calls of a worker with ``async def`` methods run concurrently on one
event loop that lives as long as the worker, as a Ray async actor's do."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from launcher_marks import TEST_LAUNCHER
from rlinf.scheduler import NodePlacementStrategy, Worker, WorkerGroup


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:6]}"


class AsyncEnv(Worker):
    def __init__(self):
        super().__init__()
        self.running = False
        self.steps = 0
        self.background_done = False

    async def interact(self):
        self.running = True
        while self.running:
            self.steps += 1
            await asyncio.sleep(0.01)
        return self.steps

    def stop(self):
        self.running = False
        return "stopped"

    def is_running(self):
        return self.running

    async def start_background(self):
        self._task = asyncio.create_task(self._background())
        return "started"

    async def _background(self):
        with self.worker_timer("background"):
            await asyncio.sleep(0.3)
        self.background_done = True

    def background(self):
        return self.background_done


def _wait_until(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_async_worker_loop_is_stopped_by_a_second_call(cluster):
    g = AsyncEnv.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name=_name("aenv"))
    try:
        loop = g.interact()
        assert _wait_until(lambda: all(g.is_running().wait(timeout=30)))
        assert not loop.done()
        assert g.stop().wait(timeout=30) == ["stopped", "stopped"]  # the worker's stop, while interact runs
        steps = loop.wait(timeout=30)
        assert all(s >= 1 for s in steps)
    finally:
        WorkerGroup.stop(g)


def test_tasks_outlive_their_call_and_their_timings_come_with_the_next_call(cluster):
    g = AsyncEnv.create_group().launch(cluster, NodePlacementStrategy([0]), name=_name("abg"))
    try:
        first = g.start_background()
        assert first.wait(timeout=30) == ["started"]
        assert "background" not in first.consume_durations()  # still running when the call returned
        seen = {}

        def finished():
            result = g.background()
            done = result.wait(timeout=30) == [True]
            seen.update(result.consume_durations())
            return done

        assert _wait_until(finished)
        # recorded after its call returned: delivered with the next call's durations
        assert seen["background"] >= 0.29
    finally:
        WorkerGroup.stop(g)


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="relies on killing a stuck worker, which ends an MPI job")
def test_max_concurrency_one_serialises_an_async_worker(cluster):
    g = AsyncEnv.create_group().launch(cluster, NodePlacementStrategy([0]), name=_name("aone"), max_concurrency=1)
    try:
        loop = g.interact()
        time.sleep(1.0)
        with pytest.raises(TimeoutError):
            g.stop().wait(timeout=3)  # queued behind interact, which never ends on its own
        assert not loop.done()
    finally:
        WorkerGroup.stop(g)


class SyncWorker(Worker):
    def __init__(self):
        super().__init__()

    def span(self, seconds):
        start = time.monotonic()
        time.sleep(seconds)
        return start, time.monotonic()


def test_workers_without_async_methods_run_one_call_at_a_time(cluster):
    g = SyncWorker.create_group().launch(cluster, NodePlacementStrategy([0]), name=_name("sync"))
    try:
        a, b = g.span(0.5), g.span(0.5)
        (a0, a1), = a.wait(timeout=60)
        (b0, b1), = b.wait(timeout=60)
        assert a1 <= b0 or b1 <= a0
    finally:
        g.stop()


MPI_PROGRAM = """
import asyncio, time
from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker, WorkerGroup

class AsyncEnv(Worker):
    def __init__(self):
        super().__init__()
        self.running = False

    async def interact(self):
        self.running = True
        steps = 0
        while self.running:
            steps += 1
            await asyncio.sleep(0.01)
        return steps

    def stop(self):
        self.running = False
        return "stopped"

class Sync(Worker):
    def ping(self):
        return 1

cluster = Cluster(launcher="mpi")
g = AsyncEnv.create_group().launch(cluster, NodePlacementStrategy([0]), name="aenv")
loop = g.interact()
time.sleep(1.0)
print("STOP", g.stop().wait(timeout=30))
print("STEPS", loop.wait(timeout=30)[0] > 1)
WorkerGroup.stop(g)
try:
    Sync.create_group().launch(cluster, NodePlacementStrategy([0]), name="sync", max_concurrency=2)
except Exception as exc:
    print("REFUSED", type(exc).__name__, exc)
"""


def test_async_worker_under_mpi(tmp_path):
    from test_mpi import MPIEXEC, mpirun

    if MPIEXEC is None:
        pytest.skip("needs mpi4py and an mpiexec")
    path = tmp_path / "program.py"
    path.write_text(MPI_PROGRAM)
    code, out, _ = mpirun(2, [str(path)], timeout=150)
    assert code == 0, out[-4000:]
    assert "STOP ['stopped']" in out and "STEPS True" in out, out[-4000:]
    assert "REFUSED LaunchError" in out and "max_concurrency=2" in out, out[-4000:]
