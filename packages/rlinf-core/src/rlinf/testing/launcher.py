"""``LauncherConformance``: what every launcher plugin must do.

Runs real worker groups through the launcher under test and checks the
user-visible contract: launch, parallel calls, ``execute_on``, environment
variables, timings, errors naming rank and method, a killed process
reported within seconds, unique group names, nested groups, and
point-to-point and channel traffic between the launched workers.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from rlinf.scheduler import (
    Channel,
    Cluster,
    GroupNameError,
    NodePlacementStrategy,
    Worker,
    WorkerDiedError,
    WorkerMethodError,
)


class ConformanceWorker(Worker):
    def __init__(self, tag="t"):
        super().__init__()
        self.tag = tag
        self.children = None

    def whoami(self):
        env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        return self.tag, self._rank, self._world_size, self.worker_address.get_name(), env

    def pid(self):
        return os.getpid()

    def fail_on(self, rank):
        if self._rank == rank:
            raise KeyError(f"failing on purpose on rank {rank}")
        return self._rank

    def sleep(self, seconds):
        time.sleep(seconds)
        return self._rank

    @Worker.timer("timed")
    def timed(self):
        time.sleep(0.05)
        return True

    def exchange(self, other_group):
        self.send({"from": self.worker_address.get_name()}, other_group, self._rank)
        return self.recv(other_group, self._rank)

    def spawn_children(self, n):
        self.children = ConformanceWorker.create_group("child").launch(
            Cluster(), placement_strategy=NodePlacementStrategy([0] * n)
        )
        return [i.address.get_name() for i in self.children.worker_info_list]

    def channel_put(self, channel, item):
        channel.put(item)
        return True


class LauncherConformance:
    """Subclass and set ``launcher_name`` (and ``cluster_options`` for ``Cluster``).

    pytest collects the subclass's ``test_*`` methods.  ``conformance_cluster``
    is one ``Cluster(launcher=launcher_name, **cluster_options)`` for the whole
    class; ``group`` is a fresh group of two workers on node 0 for each test,
    stopped after it.

    Example:
        ```python
        class TestMyLauncher(LauncherConformance):
            launcher_name = "my-launcher"
            cluster_options = {"num_nodes": 1}
        ```
    """

    launcher_name: str = ""
    cluster_options: dict = {}

    @pytest.fixture(scope="class")
    def conformance_cluster(self):
        return Cluster(launcher=self.launcher_name, **self.cluster_options)

    @pytest.fixture
    def group(self, conformance_cluster):
        g = ConformanceWorker.create_group("x").launch(
            conformance_cluster, NodePlacementStrategy([0, 0]), name=f"conf_{uuid.uuid4().hex[:8]}"
        )
        yield g
        g.stop()

    def test_launch_and_parallel_calls(self, group):
        """A call on the group runs on every worker and returns their results in rank order, with each
        worker's rank, world size and address name right.

        Fixture: ``group`` (two workers on node 0, launched through the launcher under test).
        """
        got = group.whoami().wait()
        assert [g[1] for g in got] == [0, 1] and {g[2] for g in got} == {2}
        assert [g[3] for g in got] == [f"{group.worker_group_name}:{r}" for r in (0, 1)]
        assert [i.rank for i in group.worker_info_list] == [0, 1]

    def test_environment(self, group):
        """Workers see ``RANK``, ``WORLD_SIZE`` and one ``MASTER_ADDR``/``MASTER_PORT`` shared by the group.

        Fixture: ``group`` (two workers on node 0, launched through the launcher under test).
        """
        envs = [g[4] for g in group.whoami().wait()]
        assert [e["RANK"] for e in envs] == ["0", "1"] and {e["WORLD_SIZE"] for e in envs} == {"2"}
        assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1 and envs[0]["MASTER_PORT"]

    def test_execute_on_and_timing(self, group):
        """``execute_on(rank)`` calls one worker only, and a ``Worker.timer`` method's durations reach the
        driver through ``consume_durations``.

        Fixture: ``group`` (two workers on node 0, launched through the launcher under test).
        """
        assert group.execute_on(1).fail_on(7).wait() == [1]
        handle = group.timed()
        assert handle.wait() == [True, True]
        assert handle.consume_durations()["timed"] >= 0.05

    def test_method_error_names_rank_and_method(self, group):
        """An exception in a worker method reaches the driver as ``WorkerMethodError`` naming the rank, the
        method and the original message.

        Fixture: ``group`` (two workers on node 0, launched through the launcher under test).
        """
        with pytest.raises(WorkerMethodError) as info:
            group.fail_on(1).wait()
        assert info.value.rank == 1 and info.value.method == "fail_on" and "failing on purpose" in str(info.value)

    def test_killed_worker_is_reported(self, group):
        """A worker killed (SIGKILL) during a call makes the wait raise ``WorkerDiedError`` naming its rank
        within seconds, not at the call's end.

        Fixture: ``group`` (two workers on node 0, launched through the launcher under test).
        """
        pids = group.pid().wait()
        handle = group.sleep(60)
        time.sleep(0.5)
        os.kill(pids[0], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerDiedError) as info:
            handle.wait(timeout=30)
        assert info.value.rank == 0 and time.monotonic() - start < 15

    def test_group_names_are_unique(self, group, conformance_cluster):
        """Launching a second group under a name in use raises ``GroupNameError``.

        Fixtures: ``group`` (whose name is reused) and ``conformance_cluster`` (the class's cluster).
        """
        with pytest.raises(GroupNameError):
            ConformanceWorker.create_group().launch(conformance_cluster, name=group.worker_group_name)

    def test_point_to_point_between_groups(self, group, conformance_cluster):
        """Workers of two groups exchange messages with ``send``/``recv``, each rank with its counterpart.

        Fixtures: ``group`` and ``conformance_cluster`` (to launch the second group on).
        """
        other = ConformanceWorker.create_group("y").launch(
            conformance_cluster, NodePlacementStrategy([0, 0]), name=f"conf_{uuid.uuid4().hex[:8]}"
        )
        try:
            a, b = group.exchange(other.worker_group_name), other.exchange(group.worker_group_name)
            assert [m["from"] for m in a.wait()] == [f"{other.worker_group_name}:{r}" for r in (0, 1)]
            assert [m["from"] for m in b.wait()] == [f"{group.worker_group_name}:{r}" for r in (0, 1)]
        finally:
            other.stop()

    def test_nested_groups(self, group):
        """A worker can launch a group of its own, whose workers are named under the worker's name.

        Fixture: ``group`` (two workers on node 0, launched through the launcher under test).
        """
        assert group.execute_on(0).spawn_children(2).wait() == [[f"{group.worker_group_name}:0:{r}" for r in (0, 1)]]

    def test_channel_between_worker_and_driver(self, group):
        """A ``Channel`` created in the driver and passed to a worker carries what the worker puts back to
        the driver.

        Fixture: ``group`` (two workers on node 0, launched through the launcher under test).
        """
        ch = Channel.create(f"conf_{uuid.uuid4().hex[:8]}")
        assert group.execute_on(1).channel_put(ch, {"v": 42}).wait() == [True]
        assert ch.get(timeout=30) == {"v": 42}
