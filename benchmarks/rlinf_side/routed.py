"""RLinf 0.3.0's side of ``benchmarks/routed.py``: the same env <-> rollout step with RLinf's ``send_to``/``recv_from``.

Arguments (JSON): ``steps``, ``warmup``, ``repeat``, ``envs``, ``rollouts`` (a list of rollout group sizes),
``batch``, ``image`` as in ``benchmarks/routed.py``.

Prints: ``step`` (rollout group size as a string -> the env ranks' median seconds per step over ``repeat``
runs) and, for a size whose run failed in a worker, ``errors`` (size -> the error's last line; the
traceback goes to standard error, the runner's log).
"""

from __future__ import annotations

import statistics
import sys
import time

import _harness

from rlinf.scheduler import Channel, NodePlacementStrategy, Worker

STATE_DIM, ACTION_DIM = 16, 7


def observations(n: int, image: int, rank: int) -> dict:
    import torch

    return {"images": torch.full((n, 3, image, image), rank, dtype=torch.uint8),
            "states": torch.full((n, STATE_DIM), float(rank))}


def caught(loop):
    """The loop's result, or ``{"error": traceback}``: an exception in an RLinf worker makes RLinf's driver
    exit (its workers signal it), so the script reports it instead."""

    def run(self, *args):
        import traceback

        try:
            return loop(self, *args)
        except Exception:
            return {"error": traceback.format_exc()}

    return run


class Env(Worker):
    def __init__(self):
        super().__init__()

    @caught
    def loop(self, rollout, obs_channel, act_channel, batch, image, steps):
        obs = observations(batch // self._world_size, image, self._rank)
        times = [time.perf_counter()]
        for _ in range(steps):
            self.send_to(rollout, obs_channel, obs, tag="obs", batch_size=batch)
            actions = self.recv_from(rollout, act_channel, tag="act", batch_size=batch)
            times.append(time.perf_counter())
        del actions
        return [b - a for a, b in zip(times, times[1:])]


class Rollout(Worker):
    def __init__(self):
        super().__init__()

    @caught
    def loop(self, env, obs_channel, act_channel, batch, image, steps):
        import torch

        local = batch // self._world_size
        actions = torch.zeros(local, ACTION_DIM)
        for _ in range(steps):
            obs = self.recv_from(env, obs_channel, tag="obs", batch_size=batch)
            assert obs["images"].shape[0] == local
            self.send_to(env, act_channel, actions, tag="act", batch_size=batch)
        del obs


class RunFailed(Exception):
    """A worker of the run raised; the message is its traceback."""


def one_run(env, rollout, names, obs_channel, act_channel, batch, image, steps) -> list:
    r = rollout.loop(names[0], obs_channel, act_channel, batch, image, steps)
    e = env.loop(names[1], obs_channel, act_channel, batch, image, steps)
    envs, rollouts = e.wait(), r.wait()
    for res in envs + rollouts:
        if isinstance(res, dict):
            raise RunFailed(res["error"])
    return [d for rank in envs for d in rank]


def main() -> None:
    a = _harness.args()
    steps, warmup, repeat = a.get("steps", 100), a.get("warmup", 30), a.get("repeat", 6)
    envs, batch, image = a.get("envs", 2), a.get("batch", 32), a.get("image", 64)
    cluster = _harness.cluster()
    out = {"step": {}}
    for n in a.get("rollouts", [1, 2]):
        env_name, rollout_name = f"bench_env_{n}", f"bench_rollout_{n}"
        env = Env.create_group().launch(cluster, NodePlacementStrategy([0] * envs), name=env_name)
        rollout = Rollout.create_group().launch(cluster, NodePlacementStrategy([0] * n), name=rollout_name)
        obs_channel, act_channel = Channel.create(f"bench_obs_{n}"), Channel.create(f"bench_act_{n}")
        names = (env_name, rollout_name)
        try:
            one_run(env, rollout, names, obs_channel, act_channel, batch, image, warmup)
            durations = []
            for _ in range(repeat):
                durations += one_run(env, rollout, names, obs_channel, act_channel, batch, image, steps)
            out["step"][str(n)] = statistics.median(durations)
        except RunFailed as exc:
            print(f"RLinf's run with {n} rollout rank(s) failed in a worker:\n{exc}", file=sys.stderr, flush=True)
            out.setdefault("errors", {})[str(n)] = str(exc).strip().splitlines()[-1]
    _harness.emit(out)
    _harness.shutdown()


if __name__ == "__main__":
    main()
