"""Routed env <-> rollout exchange per step (``Worker.send_to``/``recv_from``), against the raw channel
operations it makes and, with ``--with-rlinf``, against RLinf 0.3.0 doing the same, in one run.

    hatch run bench routed [--steps 300] [--rollouts 1,2] [--batch 32] [--image 64] [--with-rlinf]

One step is RLinf's embodied loop: every env rank ``send_to``s its observations
(a dict of a uint8 image batch ``[n, 3, image, image]`` and float32 states
``[n, 16]``) to the rollout group over one channel, the rollout ranks
``recv_from`` and merge them, answer with actions (float32 ``[n, 7]``) by
``send_to`` over a second channel, and each env rank ``recv_from``s its actions.
2 env ranks and 1 rollout rank merge 2 shards into one batch and split the
answer in two; 2 and 2 pair rank to rank.  A row's time is the median step of the
env ranks over ``--repeat`` runs of ``--steps`` steps (routed and raw runs
interleaved; a median, because a machine shared with other work stalls some steps).

Baselines:

* raw: the same ``channel.put``/``get`` calls, with the same keys and the same
  shard payloads, written by hand: the keys are computed and the batches cut
  once before the loop, and the rollout answers the shards it got without
  merging them.  What the routed exchange adds is its plan, cut, merge and
  size checks.  Target: routed time / raw time <= 1.2.
* RLinf 0.3.0 (``--with-rlinf``): ``rlinf_side/routed.py`` runs the same
  workers with RLinf's own ``send_to``/``recv_from`` and ``Channel`` in its own
  environment, after this run's cluster has stopped (``rlinf_baseline.py``),
  one run per rollout group size, each bounded by ``--rlinf-timeout``.
  Target: RLinf time / rlinf time >= 10.
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import Target, add_run_options, close_cluster, local_cluster, parse, print_table, save_bar_plot

import rlinf_baseline

from rlinf.scheduler import Channel, NodePlacementStrategy, Worker

STATE_DIM, ACTION_DIM = 16, 7


def observations(n: int, image: int, rank: int) -> dict:
    import torch

    return {"images": torch.full((n, 3, image, image), rank, dtype=torch.uint8),
            "states": torch.full((n, STATE_DIM), float(rank))}


class Env(Worker):
    """An env rank: sends its observations, takes its actions, once per step."""

    def __init__(self):
        super().__init__()

    def loop(self, rollout: str, obs_channel, act_channel, batch: int, image: int, steps: int, raw: bool):
        from rlinf.scheduler.worker.routing import build_recv_plan, build_send_plan, split_batch

        obs = observations(batch // self._world_size, image, self._rank)
        me, peers = self.worker_group_name, group_size(rollout)
        if raw:  # the keys and shards send_to/recv_from would use, computed once
            send = build_send_plan(src_group_name=me, dst_group_name=rollout, src_rank=self._rank,
                                   src_world_size=self._world_size, dst_world_size=peers, tag="obs", batch_size=batch)
            shards = list(zip([e.key for e in send.entries], split_batch(obs, [e.batch_size for e in send.entries])))
            recv = build_recv_plan(src_group_name=rollout, dst_group_name=me, dst_rank=self._rank,
                                   src_world_size=peers, dst_world_size=self._world_size, tag="act", batch_size=batch)
            keys = [e.key for e in recv.entries]
        times = [time.perf_counter()]
        for _ in range(steps):
            if raw:
                for key, shard in shards:
                    obs_channel.put(shard, key=key)
                actions = [act_channel.get(key=key) for key in keys]
            else:
                self.send_to(rollout, obs_channel, obs, tag="obs", batch_size=batch)
                actions = self.recv_from(rollout, act_channel, tag="act", batch_size=batch)
            times.append(time.perf_counter())
        del actions
        return [b - a for a, b in zip(times, times[1:])]


class Rollout(Worker):
    """A rollout rank: takes its observations, answers with actions, once per step."""

    def __init__(self):
        super().__init__()

    def loop(self, env: str, obs_channel, act_channel, batch: int, image: int, steps: int, raw: bool):
        import torch

        from rlinf.scheduler.worker.routing import build_recv_plan, build_send_plan, split_batch

        me, peers = self.worker_group_name, group_size(env)
        local = batch // self._world_size
        actions = torch.zeros(local, ACTION_DIM)
        if raw:
            recv = build_recv_plan(src_group_name=env, dst_group_name=me, dst_rank=self._rank, src_world_size=peers,
                                   dst_world_size=self._world_size, tag="obs", batch_size=batch)
            keys = [e.key for e in recv.entries]
            send = build_send_plan(src_group_name=me, dst_group_name=env, src_rank=self._rank,
                                   src_world_size=self._world_size, dst_world_size=peers, tag="act", batch_size=batch)
            shards = list(zip([e.key for e in send.entries], split_batch(actions, [e.batch_size for e in send.entries])))
        for _ in range(steps):
            if raw:
                obs = [obs_channel.get(key=key) for key in keys]
                for key, shard in shards:
                    act_channel.put(shard, key=key)
            else:
                obs = self.recv_from(env, obs_channel, tag="obs", batch_size=batch)
                assert obs["images"].shape[0] == local
                self.send_to(env, act_channel, actions, tag="act", batch_size=batch)
        del obs


def group_size(group: str) -> int:
    """The size of the running group ``group``."""
    from rlinf.scheduler.worker.routing import get_group_world_size

    return get_group_world_size(None, group)


def one_run(env, rollout, obs_channel, act_channel, batch, image, steps, raw) -> list:
    """The seconds of every step of every env rank in one run of ``steps`` steps."""
    r = rollout.loop(env.worker_group_name, obs_channel, act_channel, batch, image, steps, raw)
    e = env.loop(rollout.worker_group_name, obs_channel, act_channel, batch, image, steps, raw)
    durations = [d for rank in e.wait() for d in rank]
    r.wait()
    return durations


def measure(cluster, rollouts: int, args) -> dict:
    """Median seconds per step of the routed exchange and of its raw channel operations, over ``--repeat``
    interleaved runs of each (a median, because a machine shared with other work stalls some steps)."""
    tag = f"{rollouts}"
    env = Env.create_group().launch(cluster, NodePlacementStrategy([0] * args.envs), name=f"bench_env_{tag}")
    rollout = Rollout.create_group().launch(cluster, NodePlacementStrategy([0] * rollouts), name=f"bench_rollout_{tag}")
    obs_channel, act_channel = Channel.create(f"bench_obs_{tag}"), Channel.create(f"bench_act_{tag}")
    try:
        steps = {"routed": [], "raw": []}
        for raw in (False, True):  # warm-up: imports, connections, shared memory
            one_run(env, rollout, obs_channel, act_channel, args.batch, args.image, args.warmup, raw)
        for _ in range(args.repeat):
            for name, raw in (("routed", False), ("raw", True)):
                steps[name] += one_run(env, rollout, obs_channel, act_channel, args.batch, args.image, args.steps, raw)
        return {name: statistics.median(d) for name, d in steps.items()}
    finally:
        env.stop()
        rollout.stop()


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100, help="steps per run")
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps before the runs")
    parser.add_argument("--repeat", type=int, default=6, help="runs of each case, interleaved (the median step counts)")
    parser.add_argument("--envs", type=int, default=2, help="env ranks")
    parser.add_argument("--rollouts", default="1,2", help="rollout group sizes, one row each")
    parser.add_argument("--batch", type=int, default=32, help="the whole batch: env ranks x envs per rank")
    parser.add_argument("--image", type=int, default=64, help="image side (uint8, 3 channels)")
    rlinf_baseline.add_option(parser)
    add_run_options(parser, steps=5, warmup=2, repeat=1, rollouts="1", batch=4, image=8)
    args = parse(parser, argv)
    sizes = [int(s) for s in str(args.rollouts).split(",")]

    cluster = local_cluster()
    try:
        times = {n: measure(cluster, n, args) for n in sizes}
    finally:
        close_cluster(cluster)  # before RLinf's run: two Rays at once would share the machine's cores
    rl = None
    if args.with_rlinf:  # one RLinf run per size, each bounded by --rlinf-timeout: a hang costs one row only
        rl = {"step": {}, "errors": {}}
        for n in sizes:
            got = rlinf_baseline.try_run_rlinf("routed", {
                "steps": args.steps, "warmup": args.warmup, "repeat": args.repeat, "envs": args.envs,
                "rollouts": [n], "batch": args.batch, "image": args.image}, args.rlinf_timeout)
            for part in ("step", "errors"):
                rl[part].update((got or {}).get(part, {}))

    obs_kib = (args.batch * 3 * args.image * args.image + args.batch * STATE_DIM * 4) / 1024
    rows, targets, labels = [], [], []
    series = {"rlinf send_to/recv_from": [], "raw channel put/get": []}
    if args.with_rlinf:
        series["RLinf 0.3.0 send_to/recv_from"] = []
    for n in sizes:
        label = f"{args.envs} env -> {n} rollout"
        labels.append(label)
        routed, raw = times[n]["routed"], times[n]["raw"]
        row = [label, routed * 1e3, raw * 1e3, f"{routed / raw:.2f}x"]
        targets.append(Target(f"{label}: routed step time / raw channel operations", routed / raw, "<=", 1.2))
        series["rlinf send_to/recv_from"].append(routed * 1e3)
        series["raw channel put/get"].append(raw * 1e3)
        if args.with_rlinf:
            theirs = (rl or {}).get("step", {}).get(str(n))
            if theirs is None:
                why = (rl or {}).get("errors", {}).get(str(n), "see above")
                row += [f"failed ({why}; log: rlinf-routed.log)", ""]
                series["RLinf 0.3.0 send_to/recv_from"].append(float("nan"))
            else:
                row += [theirs * 1e3, f"{theirs / routed:.1f}x (target >= 10)"]
                targets.append(Target(f"{label}: RLinf 0.3.0 step time / rlinf", theirs / routed, ">=", 10.0))
                series["RLinf 0.3.0 send_to/recv_from"].append(theirs * 1e3)
        rows.append(row)
    header = ["exchange", "routed (ms/step)", "raw (ms/step)", "routed/raw"]
    if args.with_rlinf:
        header += ["RLinf 0.3.0 (ms/step)", "RLinf/rlinf"]
    print_table(f"Routed env <-> rollout exchange, batch {args.batch} ({obs_kib:.0f} KiB of observations a step), "
                f"median step of {args.repeat} x {args.steps} steps", header, rows)
    save_bar_plot("routed", "Routed env <-> rollout exchange per step", labels, series, "time per step (ms)",
                  log=args.with_rlinf)
    return targets


if __name__ == "__main__":
    from run import main as run_main

    raise SystemExit(run_main(["routed", *__import__("sys").argv[1:]]))
