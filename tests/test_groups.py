"""Worker groups on a real local Ray: launch, calls, execute_on, env, timing, nesting."""

import asyncio
import os
import time

import pytest

from rlinf.scheduler import NodePlacementStrategy, Worker, WorkerAddress


class TorchWorker(Worker):
    """The seed's first example on CPU: gloo all_reduce through the env:// defaults."""

    def __init__(self):
        super().__init__()

    def initialize(self):
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(backend="gloo")
        t = torch.ones(size=(1, 1), dtype=torch.float32)
        dist.all_reduce(t)
        return t

    def hello(self):
        return self._rank


class EnvWorker(Worker):
    def __init__(self, tag, scale=1):
        super().__init__()
        self.tag = tag
        self.scale = scale

    def env(self):
        keys = ["MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK"]
        return {k: os.environ.get(k) for k in keys}

    def identity(self):
        return self.tag, self._rank, self._world_size, self.worker_address.get_name(), self.worker_info.rank

    def scaled(self, x, *, offset=0):
        return x * self.scale + offset + self._rank

    @staticmethod
    def static_add(a, b):
        return a + b

    def _private(self):
        return "secret"

    @Worker.timer("decorated")
    def timed(self, base):
        with self.worker_timer("inner"):
            time.sleep(base * (self._rank + 1))
        return self._rank

    def nap(self, seconds):
        time.sleep(seconds)
        return self._rank

    async def async_method(self, x):
        await asyncio.sleep(0.01)
        return x + self._rank


def test_seed_example_gloo_all_reduce_and_execute_on(launch):
    group = launch(TorchWorker, placement=NodePlacementStrategy([0] * 4), name="my_worker_group")
    results = group.initialize().wait()
    assert [r.tolist() for r in results] == [[[4.0]]] * 4
    assert group.execute_on(0, 3).hello().wait() == [0, 3]
    assert group.hello().wait() == [0, 1, 2, 3]  # the selection applied to one call only


def test_environment_variables(launch):
    group = launch(EnvWorker, "t", placement=NodePlacementStrategy([0] * 3))
    envs = group.env().wait()
    assert [e["RANK"] for e in envs] == ["0", "1", "2"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "2"]
    assert {e["WORLD_SIZE"] for e in envs} == {"3"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"3"}
    assert {e["NODE_RANK"] for e in envs} == {"0"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert envs[0]["MASTER_ADDR"] == "127.0.0.1" and int(envs[0]["MASTER_PORT"]) > 0


def test_arguments_info_and_default_name(cluster):
    group = EnvWorker.create_group("tag", scale=10).launch(cluster, placement_strategy=NodePlacementStrategy([0, 0]))
    try:
        assert group.worker_group_name == "Worker_group_EnvWorker"
        assert group.identity().wait() == [
            ("tag", 0, 2, "Worker_group_EnvWorker:0", 0),
            ("tag", 1, 2, "Worker_group_EnvWorker:1", 1),
        ]
        assert group.scaled(2, offset=1).wait() == [21, 22]
        assert group.static_add(2, 3).wait() == [5, 5]
        assert EnvWorker.static_add(1, 1) == 2
        infos = group.worker_info_list
        assert [i.rank for i in infos] == [0, 1]
        assert [i.address for i in infos] == [WorkerAddress("Worker_group_EnvWorker", r) for r in (0, 1)]
        assert {i.node_id for i in infos} == {0} and {i.node_ip for i in infos} == {"127.0.0.1"}
        assert all(i.available_gpus == [] and i.gpu_id is None for i in infos)
        assert len({i.pid for i in infos}) == 2
    finally:
        group.stop()


def test_default_placement_is_one_worker_on_node_zero(launch):
    group = launch(EnvWorker, "x")
    assert group.world_size == 1 and group.identity().wait()[0][1:3] == (0, 1)


def test_results_are_non_blocking_and_awaitable(launch):
    group = launch(EnvWorker, "x", placement=NodePlacementStrategy([0, 0]))
    start = time.monotonic()
    handle = group.nap(3.0)  # every rank sleeps 3 s
    returned = time.monotonic() - start
    assert not handle.done()
    assert returned < 2.5, returned  # returned before any worker could have finished
    assert asyncio.run(handle.async_wait()) == [0, 1]
    assert handle.done()
    assert group.async_method(5).wait() == [5, 6]


def test_timing_reduced_over_ranks_and_consumed_once(launch):
    group = launch(EnvWorker, "x", placement=NodePlacementStrategy([0, 0]))
    first = group.timed(0.1)
    second = group.timed(0.02)  # a later call's timings never mix into the first
    assert first.wait() == [0, 1]
    durations = first.consume_durations()
    assert set(durations) == {"decorated", "inner"}
    # upper bounds stay loose (a loaded machine oversleeps); the reductions are checked against the per-rank values
    assert 0.2 <= durations["inner"] < 10  # max over ranks: rank 1 slept 0.2 s
    assert durations["decorated"] >= durations["inner"]
    assert first.consume_durations() == {}
    reduced, per_rank = second.consume_durations(reduction_type="min", return_per_rank=True)
    assert len(per_rank) == 2 and per_rank[0]["inner"] >= 0.02 and per_rank[1]["inner"] >= 0.04
    assert reduced["inner"] == min(r["inner"] for r in per_rank) and reduced["inner"] < 10
    mean, per_rank = group.timed(0.05).consume_durations("mean", return_per_rank=True)
    assert mean["inner"] == sum(r["inner"] for r in per_rank) / 2 and 0.07 <= mean["inner"] < 10
    with pytest.raises(ValueError):
        group.timed(0.0).consume_durations("sum")


class Parent(Worker):
    def __init__(self):
        super().__init__()
        self.children = None

    def spawn_children(self, n):
        from rlinf.scheduler import Cluster

        self.children = Child.create_group(self.worker_address.get_name()).launch(
            Cluster(), placement_strategy=NodePlacementStrategy([0] * n)
        )
        return [i.address.get_name() for i in self.children.worker_info_list]

    def ask_children(self):
        return self.children.whoami().wait()


class Child(Worker):
    def __init__(self, parent_name):
        super().__init__()
        self.parent_name = parent_name

    def whoami(self):
        addr = self.worker_address
        return addr.get_name(), addr.get_parent_address().get_name(), self.parent_name


def test_nested_child_groups_extend_addresses(launch):
    parents = launch(Parent, placement=NodePlacementStrategy([0]), name="nest")
    assert parents.spawn_children(2).wait() == [["nest:0:0", "nest:0:1"]]
    assert parents.ask_children().wait() == [[("nest:0:0", "nest:0", "nest:0"), ("nest:0:1", "nest:0", "nest:0")]]
