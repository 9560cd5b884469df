"""A small RLinf-style runner on CPU: placement from a config, an async env worker
stopped by its own ``stop()``, rollout and actor groups exchanging batches through
channels, and timings consumed per step, written as an RLinf runner is."""

from __future__ import annotations

import asyncio
import uuid

import torch
from omegaconf import OmegaConf

from rlinf.scheduler import Channel, HybridComponentPlacement, Worker, WorkerGroup


class EnvWorker(Worker):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self._running = False

    async def interact(self, obs_channel: Channel, action_channel: Channel):
        """Emit observations and consume actions until ``stop()``."""
        self._running = True
        steps = 0
        while self._running:
            with self.worker_timer("env_step"):
                obs_channel.put(torch.full((self.cfg.obs_dim,), float(steps)), key=f"env{self._rank}")
                while self._running:
                    try:
                        action = action_channel.get_nowait(key=f"env{self._rank}")
                        break
                    except asyncio.QueueEmpty:
                        await asyncio.sleep(0.01)
                else:
                    break
            assert action.shape == (self.cfg.obs_dim,)
            steps += 1
        return steps

    def stop(self):
        self._running = False


class RolloutWorker(Worker):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg

    @Worker.timer()
    def generate(self, obs_channel: Channel, action_channel: Channel, batch_channel: Channel, num_envs: int):
        batch = []
        for env in range(num_envs):
            obs = obs_channel.get(key=f"env{env}", timeout=60)
            action = obs * 2
            action_channel.put(action, key=f"env{env}")
            batch.append(torch.stack([obs, action]))
        for actor_rank in range(self.cfg.actor_world_size):  # every actor rank gets the step's batch
            batch_channel.put({"rollout_rank": self._rank, "data": torch.stack(batch)}, weight=1, key=f"actor{actor_rank}")
        return len(batch)


class ActorWorker(Worker):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.weight = torch.zeros(cfg.obs_dim)

    def run_training(self, batch_channel: Channel):
        with self.worker_timer("fetch"):
            batches = batch_channel.get_batch(target_weight=1, key=f"actor{self._rank}", timeout=60)
        with self.worker_timer():  # tag: run_training
            for b in batches:
                self.weight += b["data"][:, 1].mean(dim=0)
        return float(self.weight.sum())


def test_rlinf_style_runner(cluster):
    cfg = OmegaConf.create(
        {
            "cluster": {"num_nodes": 1, "component_placement": {"env,rollout": "0", "actor": "0:0-1"}},
            "env": {"obs_dim": 4},
            "rollout": {"obs_dim": 4, "actor_world_size": 2},
            "actor": {"obs_dim": 4},
        }
    )
    placement = HybridComponentPlacement(cfg, cluster)
    assert placement.get_world_size("actor") == 2
    suffix = uuid.uuid4().hex[:6]
    env = EnvWorker.create_group(cfg.env).launch(cluster, placement.get_strategy("env"), name=f"Env{suffix}")
    rollout = RolloutWorker.create_group(cfg.rollout).launch(
        cluster, placement_strategy=placement.get_strategy("rollout"), name=f"Rollout{suffix}")
    actor = ActorWorker.create_group(cfg.actor).launch(
        cluster, placement_strategy=placement.get_strategy("actor"), name=f"Actor{suffix}")
    groups = [env, rollout, actor]
    try:
        obs_ch = Channel.create(f"obs{suffix}")
        act_ch = Channel.create(f"act{suffix}")
        batch_ch = Channel.create(f"batch{suffix}", maxsize=4)
        env_handle = env.interact(obs_ch, act_ch)
        metrics = []
        for _ in range(3):
            gen = rollout.generate(obs_ch, act_ch, batch_ch, placement.get_world_size("env"))
            train = actor.run_training(batch_ch)
            assert gen.wait(timeout=120) == [1]
            losses = train.wait(timeout=120)
            step_times = {**gen.consume_durations(), **train.consume_durations(reduction_type="mean")}
            metrics.append(step_times)
            assert losses[0] == losses[1]  # both actor ranks saw the same batches
        assert all({"generate", "fetch", "run_training"} <= set(m) for m in metrics)
        assert all(v >= 0 for m in metrics for v in m.values())
        assert not env_handle.done()  # the env loop runs across steps
        env.stop().wait(timeout=60)  # the env worker's own stop
        steps, = env_handle.wait(timeout=60)
        assert steps in (2, 3)  # the third action may still be in the channel when stop() lands
        assert env_handle.consume_durations()["env_step"] > 0
    finally:
        for g in reversed(groups):
            WorkerGroup.stop(g)
