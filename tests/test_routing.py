"""Routing helpers (``rlinf.scheduler.worker.routing``): plans, keys, messages, batch split/merge.

The exact plans and keys are RLinf's; the properties check that what the senders' plans
send is what the receivers' plans take, each item once and in order, for any world sizes.
The group-size lookups run against a real local cluster.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlinf.scheduler import NodePlacementStrategy, Worker
from rlinf.scheduler.worker.routing import (
    BatchSplitError,
    CommMapper,
    DecoupledRouteEntry,
    RouteEntry,
    RouteSizeError,
    build_recv_plan,
    build_route_channel_key,
    build_send_key,
    build_send_plan,
    decoupled_build_recv_plan,
    decoupled_build_send_plan,
    get_batch_size,
    get_group_info,
    get_group_world_size,
    infer_batch_size,
    merge_batches,
    split_batch,
    split_channel_message,
    validate_batch_size,
)

PROPS = settings(max_examples=60, deadline=None)


# -- messages and keys ----------------------------------------------------------------------------
def test_split_channel_message():
    assert split_channel_message("3_7_train_obs") == (3, 7, "train", "obs")
    assert split_channel_message("0_1_eval_rollout_results") == (0, 1, "eval", "rollout_results")
    assert split_channel_message("2_0_None_obs") == (2, 0, "None", "obs")
    for bad in ("1_2_train", "x_0_train_obs", "1_y_train_obs", ""):
        with pytest.raises(ValueError):
            split_channel_message(bad)


def test_keys():
    assert CommMapper.build_channel_key(1, 2, "pipeline_actor") == "1_2_pipeline_actor"
    assert build_route_channel_key("env", "rollout", 0, 3, None) == (
        "scheduler_route", "env", "rollout", "default", "", 0, 3)
    assert build_route_channel_key("env", "rollout", 0, 3, "obs", "k") == (
        "scheduler_route", "env", "rollout", "obs", "k", 0, 3)
    assert build_route_channel_key("a", "b", None, None, "", ("x", 1))[3:] == ("default", "('x', 1)", None, None)
    assert build_send_key(src_group_name="a", dst_group_name="b", src_rank=1, dst_rank=2, tag="t", route_key=5) == (
        "scheduler_route", "a", "b", "t", "5", 1, 2)
    with pytest.raises(TypeError):  # keyword-only, as in RLinf
        build_send_key("a", "b", 1, 2, "t")


# -- rank mapping ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "batch, src_ws, dst_ws, dst_ranks, src_ranks",
    [
        (8, 2, 4, [[(0, 2), (1, 2)], [(2, 2), (3, 2)]], [[(0, 2)], [(0, 2)], [(1, 2)], [(1, 2)]]),
        (8, 4, 2, [[(0, 2)], [(0, 2)], [(1, 2)], [(1, 2)]], [[(0, 2), (1, 2)], [(2, 2), (3, 2)]]),
        (6, 3, 2, [[(0, 2)], [(0, 1), (1, 1)], [(1, 2)]], [[(0, 2), (1, 1)], [(1, 1), (2, 2)]]),
        (6, 1, 3, [[(0, 2), (1, 2), (2, 2)]], [[(0, 2)], [(0, 2)], [(0, 2)]]),
        (6, 3, 1, [[(0, 2)], [(0, 2)], [(0, 2)]], [[(0, 2), (1, 2), (2, 2)]]),
        (12, 4, 6, [[(0, 2), (1, 1)], [(1, 1), (2, 2)], [(3, 2), (4, 1)], [(4, 1), (5, 2)]],
         [[(0, 2)], [(0, 1), (1, 1)], [(1, 2)], [(2, 2)], [(2, 1), (3, 1)], [(3, 2)]]),
        (0, 2, 3, [[], []], [[], [], []]),
    ],
)
def test_comm_mapper_ranks(batch, src_ws, dst_ws, dst_ranks, src_ranks):
    assert [CommMapper.get_dst_ranks(batch, src_ws, dst_ws, r) for r in range(src_ws)] == dst_ranks
    assert [CommMapper.get_src_ranks(batch, src_ws, dst_ws, r) for r in range(dst_ws)] == src_ranks


@pytest.mark.parametrize(
    "call, args",
    [
        (CommMapper.get_dst_ranks, (7, 2, 4, 0)),  # batch not divisible by dst_world_size
        (CommMapper.get_dst_ranks, (8, 3, 2, 0)),  # ... by src_world_size
        (CommMapper.get_dst_ranks, (8, 2, 4, 2)),  # rank out of range
        (CommMapper.get_dst_ranks, (8, 2, 4, -1)),
        (CommMapper.get_dst_ranks, (8, 0, 4, 0)),  # no ranks
        (CommMapper.get_dst_ranks, (-4, 2, 2, 0)),
        (CommMapper.get_src_ranks, (8, 2, 3, 0)),
        (CommMapper.get_src_ranks, (8, 3, 2, 0)),
        (CommMapper.get_src_ranks, (8, 2, 4, 4)),
        (CommMapper.get_src_ranks, (8, 2, 0, 0)),
    ],
)
def test_comm_mapper_errors(call, args):
    with pytest.raises(RouteSizeError) as info:
        call(*args)
    assert isinstance(info.value, AssertionError) and isinstance(info.value, ValueError)  # RLinf asserts


def test_decoupled_batch_sizes():
    get = CommMapper.decoupled_get_batch_size
    assert get(32, 4, 2) == [8]
    assert get(32, 4, 4) == [8]
    assert get(32, 2, 8) == [4, 4, 4, 4]
    assert get(32, 2, 4, queue_size=1) == [8]
    assert get(32, 2, 8, queue_size=3) == [4, 4, 4]
    assert get(24, 3, 2) == [8]
    for args in ((30, 4, 2, 0), (32, 2, 4, 3), (32, 0, 4, 0)):
        with pytest.raises(RouteSizeError):
            get(*args)


# -- plans ----------------------------------------------------------------------------------------
def test_send_and_recv_plans_3_to_2():
    send = build_send_plan(src_group_name="env", dst_group_name="actor", src_rank=1, src_world_size=3,
                           dst_world_size=2, tag=None, route_key="step", batch_size=6)
    assert (send.src_rank, send.dst_rank, send.tag, send.route_key) == (1, None, "default", "step")
    assert (send.src_world_size, send.dst_world_size) == (3, 2)
    assert send.entries == [
        RouteEntry(0, 1, ("scheduler_route", "env", "actor", "default", "step", 1, 0)),
        RouteEntry(1, 1, ("scheduler_route", "env", "actor", "default", "step", 1, 1)),
    ]
    recv = build_recv_plan(src_group_name="env", dst_group_name="actor", dst_rank=1, src_world_size=3,
                           dst_world_size=2, tag=None, route_key="step", batch_size=6)
    assert (recv.src_rank, recv.dst_rank) == (None, 1)
    assert recv.entries == [
        RouteEntry(1, 1, ("scheduler_route", "env", "actor", "default", "step", 1, 1)),
        RouteEntry(2, 2, ("scheduler_route", "env", "actor", "default", "step", 2, 1)),
    ]
    with pytest.raises(RouteSizeError):
        build_send_plan(src_group_name="a", dst_group_name="b", src_rank=0, src_world_size=3,
                        dst_world_size=2, tag=None, batch_size=9)


def test_decoupled_plans():
    first = decoupled_build_send_plan(src_group_name="env", dst_group_name="rollout", src_rank=2, src_world_size=2,
                                      dst_world_size=4, tag="obs", batch_size=16, mode="train")
    any_rank = ("scheduler_route", "env", "rollout", "obs", "", None, None)
    assert first.entries == [DecoupledRouteEntry(4, any_rank, "2_0_train_obs"),
                             DecoupledRouteEntry(4, any_rank, "2_1_train_obs")]
    assert (first.src_rank, first.dst_rank, first.tag) == (None, None, "obs")
    no_mode = decoupled_build_send_plan(src_group_name="env", dst_group_name="rollout", src_rank=0,
                                        src_world_size=2, dst_world_size=2, tag="obs", batch_size=4)
    assert [e.batch_index for e in no_mode.entries] == ["0_0_None_obs"]

    answer = decoupled_build_send_plan(src_group_name="rollout", dst_group_name="env", src_rank=None,
                                       src_world_size=4, dst_world_size=2, tag="actions", batch_size=16,
                                       tag_batch_router=["1_1_train_obs", "0_0_train_obs"])
    assert answer.entries == [
        DecoupledRouteEntry(4, ("scheduler_route", "rollout", "env", "obs", "", None, 1), "1_1_train_obs")]
    assert (answer.dst_rank, answer.tag) == (1, "obs")  # the last shard's, as in RLinf
    with pytest.raises(ValueError):
        decoupled_build_send_plan(src_group_name="r", dst_group_name="e", src_rank=None, src_world_size=2,
                                  dst_world_size=4, tag="t", batch_size=16, tag_batch_router=["0_0_m_t"])

    recv = decoupled_build_recv_plan(src_group_name="env", dst_group_name="rollout", recv_rank=3,
                                     src_world_size=2, dst_world_size=4, tag="obs", route_key=1, batch_size=16,
                                     recv_queue_size=1)
    assert recv.entries == [DecoupledRouteEntry(4, ("scheduler_route", "env", "rollout", "obs", "1", None, 3), None)]
    assert (recv.src_rank, recv.dst_rank) == (None, None)


# -- batches ----------------------------------------------------------------------------------------
@dataclass
class Step:
    obs: torch.Tensor
    names: list
    extra: Optional[dict] = None
    info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    y: Optional[np.ndarray] = None


def test_infer_batch_size():
    assert infer_batch_size(torch.zeros(5, 2)) == 5
    assert infer_batch_size(np.zeros((3, 4))) == 3
    assert infer_batch_size([1, 2]) == 2
    assert infer_batch_size({"a": None, "b": {"c": torch.zeros(4)}}) == 4
    assert infer_batch_size(Step(obs=torch.zeros(6), names=list("abcdef"))) == 6
    assert infer_batch_size(Frozen(x=None, y=np.zeros(2))) == 2
    assert get_batch_size([1, 2, 3]) == 3
    assert get_batch_size({"n": 7}, lambda d: d["n"]) == 7
    for bad in ({}, {"a": None}, 3, (1, 2), torch.tensor(1.0), "abc", Frozen(x=None)):
        with pytest.raises(ValueError):
            infer_batch_size(bad)
    validate_batch_size([1, 2], 2)
    validate_batch_size("not a batch", None)
    with pytest.raises(ValueError):
        validate_batch_size([1, 2], 3)


def test_split_batch_kinds():
    t = torch.arange(12).reshape(2, 6).T  # not contiguous
    parts = split_batch(t, [2, 4])
    assert [p.shape[0] for p in parts] == [2, 4] and all(p.is_contiguous() for p in parts)
    assert torch.equal(torch.cat(parts), t)
    a = np.arange(5)
    assert [list(p) for p in split_batch(a, [0, 2, 3])] == [[], [0, 1], [2, 3, 4]]
    assert split_batch(list("abcde"), [3, 2]) == [["a", "b", "c"], ["d", "e"]]
    d = split_batch({"x": [1, 2, 3], "n": None, "sub": {"y": np.arange(3)}}, [1, 2])
    assert d[0]["x"] == [1] and d[1]["n"] is None and list(d[1]["sub"]["y"]) == [1, 2]
    f = split_batch(Frozen(x=torch.arange(4)), [3, 1])
    assert all(type(p) is Frozen for p in f) and f[1].x.tolist() == [3] and f[0].y is None


@pytest.mark.parametrize("data", [torch.zeros(4), np.zeros(4), [0] * 4, {"a": [0] * 4}])
def test_split_batch_bad_sizes(data):
    for sizes in ([1, 2], [2, 3], [5, -1]):
        with pytest.raises(BatchSplitError) as info:
            split_batch(data, sizes)
        assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)


def test_split_batch_unsupported():
    for bad in ((1, 2), 3, {"a": [1, 2], "v": 7}):
        with pytest.raises(ValueError):
            split_batch(bad, [1, 1])


def test_merge_batches_rules():
    with pytest.raises(ValueError):
        merge_batches([])
    only = {"a": [1]}
    assert merge_batches([only]) is only
    assert merge_batches([None, None]) is None
    assert merge_batches([{"v": 3, "a": [1]}, {"v": 3, "a": [2]}]) == {"v": 3, "a": [1, 2]}
    assert merge_batches([{"n": None, "a": [1]}, {"n": None, "a": [2]}]) == {"n": None, "a": [1, 2]}
    assert list(merge_batches([{"z": [1], "a": [2]}, {"a": [3], "z": [4]}])) == ["z", "a"]  # the first's order
    assert list(merge_batches([np.arange(2), np.arange(1)])) == [0, 1, 0]
    for bad in (
        [None, [1]], [[1], None], [(1,), (2,)], [{"a": [1]}, {"b": [1]}], [[1], (2,)],
        [torch.zeros(1), np.zeros(1)], [Frozen(torch.zeros(1)), Step(torch.zeros(1), [1])],
    ):
        with pytest.raises(ValueError):
            merge_batches(bad)
    merged = merge_batches([Frozen(torch.tensor([1]), None), Frozen(torch.tensor([2, 3]), None)])
    assert type(merged) is Frozen and merged.x.tolist() == [1, 2, 3] and merged.y is None


# -- properties: split then merge gives the batch back ---------------------------------------------
def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (Step, Frozen)):
        return type(a) is type(b) and all(_equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)
    return a == b


@st.composite
def sizes_for(draw, n):
    """A random partition of ``n`` into 1..5 ordered parts (zeros allowed)."""
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=0, max_size=4)))
    bounds = [0, *cuts, n]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def leaf(n):
    return st.one_of(
        st.builds(lambda k, seed: torch.randn(n, k, generator=torch.Generator().manual_seed(seed)),
                  st.integers(1, 3), st.integers(0, 99)),
        st.builds(lambda off: np.arange(off, off + n, dtype=np.int64), st.integers(-5, 5)),
        st.lists(st.integers(), min_size=n, max_size=n),
        st.lists(st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), min_size=n, max_size=n),
    )


def batch_of(n):
    return st.recursive(
        leaf(n),
        lambda inner: st.dictionaries(st.text(min_size=1, max_size=4), st.one_of(st.none(), inner), min_size=1,
                                      max_size=3).filter(lambda d: any(v is not None for v in d.values())),
        max_leaves=6,
    )


@st.composite
def batch_and_sizes(draw, kind):
    n = draw(st.integers(0, 10))
    if kind == "dict_of_tensors":
        keys = draw(st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=4, unique=True))
        data = {k: torch.randn(n, draw(st.integers(1, 3))) for k in keys}
    elif kind == "dataclass":
        data = Step(obs=torch.arange(n * 2).reshape(n, 2), names=[f"e{i}" for i in range(n)],
                    extra=draw(st.one_of(st.none(), st.just({"r": np.arange(n), "m": {"q": torch.ones(n)}}))),
                    info={"frozen": Frozen(x=torch.arange(n), y=draw(st.one_of(st.none(), st.just(np.zeros(n)))))})
    else:
        data = draw(batch_of(n))
    return data, draw(sizes_for(n))


@PROPS
@given(st.sampled_from(["dict_of_tensors", "dataclass", "nested"]).flatmap(batch_and_sizes))
def test_split_then_merge_round_trips(case):
    data, sizes = case
    shards = split_batch(data, sizes)
    assert len(shards) == len(sizes)
    assert [infer_batch_size(s) for s in shards if _has_batch(s)] == [z for s, z in zip(shards, sizes) if _has_batch(s)]
    assert _equal(merge_batches(shards), data)


def _has_batch(data) -> bool:
    try:
        infer_batch_size(data)
        return True
    except ValueError:
        return False


# -- properties: plans agree ------------------------------------------------------------------------
@st.composite
def world_sizes_and_batch(draw):
    s, d = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    return s, d, math.lcm(s, d) * draw(st.integers(0, 4))


@PROPS
@given(world_sizes_and_batch(), st.sampled_from([None, "obs"]), st.sampled_from([None, 3]))
def test_coupled_plans_deliver_every_item_once_in_order(sizes, tag, route_key):
    """Each source rank holds its slice of ``range(B)``, splits it by its send plan and puts each
    shard under its key; each destination rank takes its recv plan's shards and merges them."""
    src_ws, dst_ws, batch = sizes
    queues = defaultdict(list)
    for r in range(src_ws):
        plan = build_send_plan(src_group_name="A", dst_group_name="B", src_rank=r, src_world_size=src_ws,
                               dst_world_size=dst_ws, tag=tag, route_key=route_key, batch_size=batch)
        assert sum(e.batch_size for e in plan.entries) == batch // src_ws
        held = list(range(r * batch // src_ws, (r + 1) * batch // src_ws))
        for entry, shard in zip(plan.entries, split_batch(held, [e.batch_size for e in plan.entries])):
            assert entry.key[-2:] == (r, entry.peer_rank)
            queues[entry.key].append(shard)
    for r in range(dst_ws):
        plan = build_recv_plan(src_group_name="A", dst_group_name="B", dst_rank=r, src_world_size=src_ws,
                               dst_world_size=dst_ws, tag=tag, route_key=route_key, batch_size=batch)
        got = [queues[e.key].pop(0) for e in plan.entries]
        for shard, entry in zip(got, plan.entries):
            validate_batch_size(shard, entry.batch_size)
        merged = merge_batches(got) if got else []
        assert merged == list(range(r * batch // dst_ws, (r + 1) * batch // dst_ws))
    assert not any(queues.values())  # nothing sent that no one took


@st.composite
def divisible_world_sizes(draw):
    small, factor = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    s, d = (small, small * factor) if draw(st.booleans()) else (small * factor, small)
    return s, d, max(s, d) * draw(st.integers(1, 3))


@PROPS
@given(divisible_world_sizes())
def test_decoupled_plans_answer_every_sender(sizes):
    """Env ranks send tagged shards to any rollout rank; rollout ranks take them all, record the
    messages, and answer through them; each env rank gets back exactly its own shards."""
    env_ws, rollout_ws, batch = sizes
    queues = defaultdict(list)
    sent = {}
    for e in range(env_ws):
        plan = decoupled_build_send_plan(src_group_name="env", dst_group_name="rollout", src_rank=e,
                                         src_world_size=env_ws, dst_world_size=rollout_ws, tag="obs",
                                         batch_size=batch, mode="train")
        held = [(e, i) for i in range(batch // env_ws)]
        sent[e] = held
        for entry, shard in zip(plan.entries, split_batch(held, [x.batch_size for x in plan.entries])):
            queues[entry.key].append({"batch_index": entry.batch_index, "batch": shard})
    for r in range(rollout_ws):
        plan = decoupled_build_recv_plan(src_group_name="env", dst_group_name="rollout", recv_rank=None,
                                         src_world_size=rollout_ws, dst_world_size=env_ws, tag="obs",
                                         batch_size=batch)
        items = [queues[x.key].pop(0) for x in plan.entries]
        router = [it["batch_index"] for it in items]
        data = merge_batches([it["batch"] for it in items])
        answer = decoupled_build_send_plan(src_group_name="rollout", dst_group_name="env", src_rank=None,
                                           src_world_size=rollout_ws, dst_world_size=env_ws, tag="obs",
                                           batch_size=batch, tag_batch_router=router)
        for entry, shard in zip(answer.entries, split_batch(data, [x.batch_size for x in answer.entries])):
            queues[entry.key].append({"batch_index": entry.batch_index, "batch": shard})
    assert not any(q for k, q in queues.items() if k[2] == "rollout")  # every first-leg shard was taken
    for e in range(env_ws):
        plan = decoupled_build_recv_plan(src_group_name="rollout", dst_group_name="env", recv_rank=e,
                                         src_world_size=env_ws, dst_world_size=rollout_ws, tag="obs",
                                         batch_size=batch)
        items = [queues[x.key].pop(0) for x in plan.entries]
        items.sort(key=lambda it: split_channel_message(it["batch_index"])[1])
        assert merge_batches([it["batch"] for it in items]) == sent[e]
    assert not any(queues.values())


# -- group sizes, from a real cluster -----------------------------------------------------------------
class SizeProbe(Worker):
    """Looks group sizes up from inside a worker."""

    def world_size_of(self, group_name):
        return get_group_world_size(None, group_name)


def test_group_world_size_from_the_cluster(cluster, launch):
    probes = launch(SizeProbe, placement=NodePlacementStrategy([0, 0]))
    name = probes.worker_group_name
    assert get_group_world_size(None, name) == 2
    assert get_group_world_size(cluster.session, name) == 2
    info = get_group_info(None, name)
    assert info.rank == 0 and info.group_world_size == 2
    assert probes.world_size_of(name).wait(timeout=60) == [2, 2]
    with pytest.raises(ValueError, match="not registered"):
        get_group_world_size(None, "no_such_group_here")


class ManagerProxy:
    """What RLinf's manager proxy offers for this: ``get_worker_info(WorkerAddress)``."""

    def __init__(self, infos):
        self.infos = infos

    def get_worker_info(self, address):
        return self.infos.get(address.root_group_name)


def test_group_world_size_from_an_rlinf_manager_proxy():
    from rlinf.scheduler import WorkerAddress, WorkerInfo

    info = WorkerInfo(address=WorkerAddress("actor", 0), rank=0, node_id=0, gpu_id=None, node_ip="127.0.0.1",
                      group_world_size=4)
    proxy = ManagerProxy({"actor": info})
    assert get_group_world_size(proxy, "actor") == 4
    assert get_group_info(proxy, "actor") is info
    with pytest.raises(ValueError, match="not registered"):
        get_group_world_size(proxy, "env")
