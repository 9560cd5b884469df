"""Names RLinf programs import from the scheduler, used the way those programs use them.

Group route binding (``rlinf.scheduler.worker.routing``): an env/rollout pipeline whose
env ranks each talk to one rollout rank over a per-group channel key.

A program that imports Ray (``ray.util.queue``) before it builds its ``Cluster``, as RLinf's
channel benchmark does, and passes a shared channel and a Ray queue to its workers.
"""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from launcher_marks import TEST_LAUNCHER

from rlinf.scheduler.worker import routing
from rlinf.scheduler.worker.routing import GroupRouteBinding, balanced_group_id


def _groups(envs: int, rollouts: int) -> list[int]:
    return [balanced_group_id(r, envs, rollouts) for r in range(envs)]


def test_groups_are_contiguous_even_and_larger_first():
    assert _groups(5, 2) == [0, 0, 0, 1, 1]
    assert _groups(7, 3) == [0, 0, 0, 1, 1, 2, 2]
    assert _groups(3, 3) == [0, 1, 2]
    assert _groups(6, 1) == [0] * 6
    for envs in range(1, 13):
        for rollouts in range(1, envs + 1):
            ids = _groups(envs, rollouts)
            sizes = [ids.count(g) for g in range(rollouts)]
            assert ids == sorted(ids) and min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)


def test_more_rollouts_than_envs_and_bad_ranks_are_refused():
    with pytest.raises(ValueError, match="env_world_size >= rollout_world_size"):
        balanced_group_id(1, 3, 5)
    with pytest.raises(ValueError, match="env_rank"):
        balanced_group_id(4, 4, 2)
    with pytest.raises(ValueError, match="rollout_rank"):
        GroupRouteBinding.for_rollout(enabled=True, decoupled_mode=True, rollout_rank=2,
                                      env_world_size=4, rollout_world_size=2)


def test_every_env_request_reaches_the_rollout_that_serves_its_group():
    envs, rollouts = 6, 4
    served = {
        GroupRouteBinding.for_rollout(enabled=True, decoupled_mode=True, rollout_rank=r,
                                      env_world_size=envs, rollout_world_size=rollouts).route_key: r
        for r in range(rollouts)
    }
    assert sorted(served) == ["grp0", "grp1", "grp2", "grp3"]
    owners = [served[GroupRouteBinding.for_env(enabled=True, decoupled_mode=True, env_rank=e,
                                               env_world_size=envs, rollout_world_size=rollouts).route_key]
              for e in range(envs)]
    assert owners == [0, 0, 1, 1, 2, 3]


def test_binding_off_uses_the_shared_queue_and_needs_no_valid_sizes():
    env = GroupRouteBinding.for_env(enabled=False, decoupled_mode=True, env_rank=0,
                                    env_world_size=1, rollout_world_size=8)
    rollout = GroupRouteBinding.for_rollout(enabled=False, decoupled_mode=False, rollout_rank=5,
                                            env_world_size=1, rollout_world_size=8)
    assert env.route_key is None and rollout.route_key is None


@pytest.mark.parametrize("maker", ["for_env", "for_rollout"])
def test_binding_without_decoupled_mode_is_refused(maker):
    rank = {"for_env": {"env_rank": 0}, "for_rollout": {"rollout_rank": 0}}[maker]
    with pytest.raises(ValueError, match="enable_group_route_binding=true requires .*enable_decoupled_mode=true"):
        getattr(GroupRouteBinding, maker)(enabled=True, decoupled_mode=False, env_world_size=2,
                                          rollout_world_size=1, **rank)


def test_names_are_exported_where_rlinf_has_them():
    assert {"GroupRouteBinding", "balanced_group_id"} <= set(routing.__all__)


PROGRAM = """
import asyncio
from ray.util.queue import Queue  # Ray imported before rlinf starts its embedded cluster
from rlinf.scheduler import Channel, Cluster, NodePlacementStrategy, Worker

class Writer(Worker):
    def fill(self, channel, n, keys=None):
        with self.worker_timer("fill"):
            for i in range(n):
                if keys:
                    channel.put(i, key=keys[i])
                else:
                    channel.put(i)
        return self.pop_execution_time("fill")

    def fill_async(self, channel, n):
        async def go():
            for i in range(n):
                await channel.put(i, async_op=True).async_wait()
        asyncio.run(go())
        return n

    def to_queue(self, queue, n):
        for i in range(n):
            queue.put(i)
        return n

class Reader(Worker):
    def drain_async(self, channel, n):
        async def go():
            return [await channel.get(async_op=True).async_wait() for _ in range(n)]
        return asyncio.run(go())

    def drain_keys(self, channel, keys):
        return [channel.get(key=k) for k in keys]

    def from_queue(self, queue, n):
        async def go():
            return [await queue.get_async() for _ in range(n)]
        return asyncio.run(go())

def drain_now(channel):
    got = []
    while True:
        try:
            got.append(channel.get_nowait())
        except asyncio.QueueEmpty:
            return got

cluster = Cluster(num_nodes=1, num_cpus=2)
where = NodePlacementStrategy(node_ranks=[0])
writer = Writer.create_group().launch(cluster=cluster, placement_strategy=where, name="compat_writer")
reader = Reader.create_group().launch(cluster=cluster, placement_strategy=where, name="compat_reader")
channel = Channel.create(name="compat_shared", maxsize=0, distributed=False)

elapsed = writer.fill(channel, 4).wait()[0]
print("TIMED", type(elapsed).__name__, elapsed >= 0, flush=True)
print("ASYNC_GET", reader.drain_async(channel, 4).wait()[0], flush=True)
writer.fill_async(channel, 3).wait()
print("NOWAIT", drain_now(channel), drain_now(channel), flush=True)
writer.fill(channel, 6, keys=[0, 1, 2, 0, 1, 2]).wait()
print("KEYED", reader.drain_keys(channel, [2, 2, 1, 0, 0, 1]).wait()[0], flush=True)
queue = Queue()
writer.to_queue(queue, 3).wait()
print("RAY_QUEUE", reader.from_queue(queue, 3).wait()[0], flush=True)
"""


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts an embedded Ray cluster of its own")
@pytest.mark.timeout(150)
def test_a_program_that_imports_ray_first_shares_a_channel_and_a_ray_queue_with_its_workers():
    base = tempfile.mkdtemp(prefix="rlt")  # short: Ray's socket paths must fit in 107 bytes
    # nothing rlinf would set before Ray's import: the program's Ray reads its settings before rlinf runs
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_ADDRESS", "RAY_AUTH", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"))}
    env.update(RLINF_RAY_TEMP_DIR=base, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=140)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert "listens on addresses other than loopback" not in out, out[-3000:]
    assert proc.returncode == 0, out[-3000:]
    assert "TIMED float True" in proc.stdout, out[-3000:]
    assert "ASYNC_GET [0, 1, 2, 3]" in proc.stdout, out[-3000:]
    assert "NOWAIT [0, 1, 2] []" in proc.stdout, out[-3000:]  # drained, then empty at once
    assert "KEYED [2, 5, 1, 0, 3, 4]" in proc.stdout, out[-3000:]  # FIFO within each key
    assert "RAY_QUEUE [0, 1, 2]" in proc.stdout, out[-3000:]
