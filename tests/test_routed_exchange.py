"""``Worker.send_to`` / ``recv_from``: RLinf's routed exchange between groups of different sizes, on a real local Ray.

Three groups of 1, 2 and 3 workers, launched once for the module, exchange
batches over a channel and point to point, synchronously and asynchronously:
2 -> 1 merges, 1 -> 2 splits, 2 -> 3 splits and merges.  Decoupled mode
sends env requests to a rollout worker and routes its answer back to the env
rank each item came from.  Wrong batch sizes are refused as RLinf refuses them.
"""

import pytest

from rlinf.scheduler import Channel, NodePlacementStrategy, Worker
from rlinf.scheduler.collective import AsyncRouteWork

from p2p_helpers import Peer, ship


@pytest.fixture(scope="module")
def groups(cluster):
    launched = {}
    for size in (1, 2, 3):
        launched[size] = Peer.create_group().launch(cluster, NodePlacementStrategy([0] * size), name=f"routed{size}")
    yield launched
    for g in launched.values():
        g.stop()


@pytest.fixture(scope="module")
def channel(groups):
    """One channel for the module (a channel's host is a worker process): each test uses tags of its own."""
    return Channel.create("routed_exchange")


def _on_all(group, fn, *args):
    return group.run(ship(fn), *args)


# -- what the workers run ---------------------------------------------------------------------------
def _part(lo, hi, kind="torch"):
    """A batch of the items ``lo..hi-1``: a float64 tensor or numpy array (item i's row is [i, i, i]), a list
    and a None.  The groups of 3 use numpy: torch takes seconds of CPU to import in each new process."""
    if kind == "numpy":
        import numpy as np

        x = np.repeat(np.arange(lo, hi, dtype=np.float64).reshape(-1, 1), 3, axis=1)
    else:
        import torch

        x = torch.arange(lo, hi, dtype=torch.float64).reshape(-1, 1).repeat(1, 3)
    return {"x": x, "ids": list(range(lo, hi)), "none": None}


def _send(w, dst, channel, total, kwargs, kind):
    """Send this rank's items of a ``total``-item batch; tensors and arrays must not go through pickle."""
    import copyreg

    per = total // w._world_size
    data = _part(w._rank * per, (w._rank + 1) * per, kind)
    cls = type(data["x"])

    def refuse(self, protocol):  # the codec carries tensors and arrays out of band: pickling one is a bug
        raise AssertionError(f"a {cls.__name__} shard was pickled")

    real = cls.__reduce_ex__
    if kind == "torch":
        cls.__reduce_ex__ = refuse
    else:  # numpy.ndarray is a C type: its pickling is refused through copyreg's table
        copyreg.pickle(cls, lambda a: refuse(a, 5))
    try:
        out = w.send_to(dst, channel, data, **kwargs)
        if kwargs.get("async_op"):
            assert isinstance(out, AsyncRouteWork)
            assert out.wait(timeout=60) is None and out.done()
            return "async sent"
        return out
    finally:
        if kind == "torch":
            cls.__reduce_ex__ = real
        else:
            copyreg.dispatch_table.pop(cls, None)


def _recv(w, src, channel, kwargs, how):
    """Receive this rank's part; returns what arrived, summarised, and the items it should hold."""
    import asyncio

    out = w.recv_from(src, channel, **kwargs)
    if kwargs.get("async_op"):
        assert isinstance(out, AsyncRouteWork)
        out = out.wait(timeout=60) if how == "wait" else asyncio.run(_await(out))
    per = kwargs["batch_size"] // w._world_size
    x = out["x"]
    assert type(x).__module__ in ("torch", "numpy") and str(x.dtype) in ("torch.float64", "float64")
    assert tuple(x.shape) == (per, 3)
    return {"kind": type(x).__module__, "ids": out["ids"], "x": x[:, 0].tolist(), "none": out["none"],
            "want": list(range(w._rank * per, (w._rank + 1) * per))}


async def _await(work):
    return await work


def _exchange(src, dst, channel, total, send_kwargs, recv_kwargs, how="wait", kind="torch"):
    """Run one exchange between two groups; returns each receiving rank's summary."""
    received = _on_all(dst, _recv, src.worker_group_name, channel, dict(recv_kwargs, batch_size=total), how)
    sent = _on_all(src, _send, dst.worker_group_name, channel, total, send_kwargs, kind).wait(timeout=60)
    assert sent == ["async sent" if send_kwargs.get("async_op") else None] * len(sent)
    return received.wait(timeout=60)


def _check(results, kind):
    for r in results:
        assert r["kind"] == kind and r["ids"] == r["want"] and r["x"] == [float(i) for i in r["want"]] and r["none"] is None


# -- normal mode ------------------------------------------------------------------------------------
@pytest.mark.parametrize("p2p", [False, True], ids=["channel", "p2p"])
def test_uneven_groups_merge_split_and_both(groups, channel, p2p):
    channel = None if p2p else channel
    one, two, three = groups[1], groups[2], groups[3]
    transport = {"enable_p2p": True} if p2p else {}
    cases = [  # source, destination, whole batch, the sender's and the receiver's arguments, how to wait, data
        (two, one, 4, dict(tag="obs"), dict(tag="obs"), "wait", "torch"),  # 2 -> 1: rank 0 merges two shards
        (one, two, 4, dict(tag="act", route_key=1, async_op=True), dict(tag="act", route_key=1), "wait", "torch"),
        # 2 -> 3 (ranks take 2 + 0, 1 + 1, 0 + 2 items); the sender's key tag is "{mode}_{tag}"
        (two, three, 6, dict(mode="train", tag="obs"), dict(tag="train_obs", async_op=True), "await", "numpy"),
        (three, two, 6, dict(tag="back", async_op=True), dict(tag="back", async_op=True), "wait", "numpy"),  # 3 -> 2
    ]
    for src, dst, total, send_kwargs, recv_kwargs, how, kind in cases:
        results = _exchange(src, dst, channel, total, dict(send_kwargs, **transport), dict(recv_kwargs, **transport),
                            how, kind)
        assert len(results) == int(dst.worker_group_name[-1])  # routed1, routed2, routed3
        _check(results, kind)


def _keys_and_sizes(w, dst, channel):
    """The keys and shard sizes rank 0 of a 2-group sends to a 3-group, read back off the channel by hand."""
    from rlinf.scheduler.worker.routing import build_route_channel_key

    w.send_to(dst, channel, list(range(3)), tag="k", route_key=("stage", 0), batch_size=6)
    me = w.worker_address.root_group_name
    keys = [build_route_channel_key(me, dst, 0, d, "k", ("stage", 0)) for d in (0, 1)]
    return [channel.get(key=k, timeout=30) for k in keys]


def test_channel_keys_are_rlinfs(groups, channel):
    got = groups[2].execute_on(0).run(ship(_keys_and_sizes), groups[3].worker_group_name, channel).wait(timeout=60)
    assert got == [[[0, 1], [2]]]  # items 0-2 of 6: 0 and 1 to rank 0, 2 to rank 1


# -- decoupled mode ---------------------------------------------------------------------------------
def _env_step(w, rollout, channel, how):
    """An env rank: send its observations (items 2r, 2r+1) as a request, then take the answer addressed to it."""
    w.batch_router = {}
    obs = _part(2 * w._rank, 2 * w._rank + 2)
    work = w.send_to(rollout, channel, obs, mode="train", tag="rollout_results", decoupled_mode=True,
                     async_op=how != "sync")
    if work is not None:
        work.wait(timeout=60)
    answer = w.recv_from(rollout, channel, tag="rollout_results", batch_size=4, decoupled_mode=True,
                         async_op=how != "sync")
    if how != "sync":
        answer = answer.wait(timeout=60)
    return {"ids": obs["ids"], "actions": answer["x"][:, 0].tolist(), "answer_ids": answer["ids"],
            "router": dict(w.batch_router)}


def _rollout_step(w, env, channel, how):
    """The rollout: take both env ranks' requests (in whatever order), answer each item with 10x its value."""
    import asyncio

    w.batch_router = {"rollout_results": []}
    work = w.recv_from(env, channel, tag="rollout_results", batch_size=4, decoupled_mode=True,
                       async_op=how != "sync")
    obs = work if how == "sync" else asyncio.run(_await(work))
    recorded = list(w.batch_router["rollout_results"])
    actions = {"x": obs["x"] * 10, "ids": obs["ids"], "none": None}
    w.send_to(env, channel, actions, tag="rollout_results", decoupled_mode=True, batch_size=4)
    return {"recorded": recorded, "after": list(w.batch_router["rollout_results"])}


@pytest.mark.parametrize("how", ["sync", "async"])
def test_decoupled_request_and_answer_routed_back(groups, channel, how):
    env, rollout = groups[2], groups[1]
    served = rollout.run(ship(_rollout_step), env.worker_group_name, channel, how)
    envs = env.run(ship(_env_step), rollout.worker_group_name, channel, how).wait(timeout=60)
    (rl,) = served.wait(timeout=60)
    # the rollout recorded one message per env rank, "{rank}_{i}_{mode}_{tag}", and cleared them once answered
    assert sorted(rl["recorded"]) == ["0_0_train_rollout_results", "1_0_train_rollout_results"]
    assert rl["after"] == []
    for rank, got in enumerate(envs):
        assert got["ids"] == [2 * rank, 2 * rank + 1]
        assert got["answer_ids"] == got["ids"]  # its own items came back to it, whatever order the rollout took them
        assert got["actions"] == [10.0 * i for i in got["ids"]]
        assert got["router"] == {}


# -- refusals ---------------------------------------------------------------------------------------
def _refusals(w, peer, channel):
    """Each bad call's (error type, message), and whether anything reached the channel."""
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = None
        except Exception as exc:  # recorded for the test to check
            out[name] = (type(exc).__name__, str(exc))

    if hasattr(w, "batch_router"):
        del w.batch_router
    attempt("short data", lambda: w.send_to(peer, channel, list(range(3)), tag="bad", batch_size=12))
    attempt("indivisible", lambda: w.send_to(peer, channel, list(range(2)), tag="bad", batch_size=4))
    attempt("shard count", lambda: w.send_to(peer, channel, list(range(3)), tag="bad", batch_size=6,
                                             split_fn=lambda d, sizes: [d, d, d]))
    attempt("no channel", lambda: w.send_to(peer, None, [1], tag="bad"))
    attempt("p2p decoupled", lambda: w.recv_from(peer, channel, batch_size=2, decoupled_mode=True, enable_p2p=True))
    attempt("no router", lambda: w.send_to(peer, channel, [1], decoupled_mode=True))
    attempt("no batch size", lambda: w.recv_from(peer, channel, tag="bad"))
    from rlinf.scheduler.worker.routing import build_route_channel_key

    me = w.worker_address.root_group_name
    out["queued"] = sum(channel.qsize(key=build_route_channel_key(me, peer, w._rank, d, "bad")) for d in range(3))
    return out


def test_bad_calls_refused_before_anything_is_sent(groups, channel):
    two, three = groups[2], groups[3]
    (got,) = two.execute_on(0).run(ship(_refusals), three.worker_group_name, channel).wait(timeout=60)
    where = "group 'routed3', in group 'routed2' rank 0 (node 0)"
    # rank 0 of 2 holds 6 of 12 items (4 for rank 0, 2 for rank 1), not 3: refused at the sender, as RLinf's
    # torch.split refuses a tensor
    assert got["short data"] == ("BatchSplitError",
                                 f"send_to to {where}: split sizes [4, 2] sum to 6, but the batch has 3 item(s)")
    assert got["indivisible"] == ("RouteSizeError", f"send_to to {where}: batch_size (4) must be divisible by dst_world_size (3).")
    kind, msg = got["shard count"]
    assert kind == "ValueError" and msg.startswith(f"send_to to {where}") and "3 shard(s) of a plan of 2" in msg
    assert got["no channel"] == ("ValueError", f"send_to to {where}: send_to requires ``channel`` when enable_p2p is False.")
    assert got["p2p decoupled"] == ("AssertionError",
                                    f"recv_from from {where}: Now, enable_p2p dpn't support when decoupled_mode is True.")
    assert got["no router"] == ("AssertionError",
                                f"send_to to {where}: batch_router must be provided when decoupled_mode is True.")
    kind, msg = got["no batch size"]
    assert kind == "TypeError" and "batch_size must be the whole batch's size" in msg
    assert got["queued"] == 0  # nothing half done


def _send_uneven(w, dst, channel):
    """A sender whose split_fn cuts 8 items 3 + 5 instead of the plan's 4 + 4."""
    w.send_to(dst, channel, list(range(8)), tag="uneven", split_fn=lambda d, sizes: [d[:3], d[3:]])


def _recv_checked(w, src, channel):
    try:
        w.recv_from(src, channel, tag="uneven", batch_size=8)
    except ValueError as exc:
        return str(exc)
    return None


def test_wrong_shard_size_refused_by_the_receiver(groups, channel):
    one, two = groups[1], groups[2]
    received = two.run(ship(_recv_checked), one.worker_group_name, channel)
    one.run(ship(_send_uneven), two.worker_group_name, channel).wait(timeout=60)
    first, second = received.wait(timeout=60)
    assert first.endswith("shard 0 (from rank 0): Expected batch size 4, but received 3.")  # RLinf's message
    assert second.endswith("shard 0 (from rank 0): Expected batch size 4, but received 5.")
    assert "recv_from from group 'routed1', in group 'routed2' rank 1" in second


def test_worker_has_the_methods():
    assert callable(Worker.send_to) and callable(Worker.recv_from)
