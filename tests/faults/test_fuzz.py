"""Bad input, generated.  Each property says what must happen, not only what must
not: valid inputs are accepted and round-trip, invalid ones are refused with
the documented exception, and nothing is half-done after a refusal."""

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rlinf.scheduler import (
    Channel,
    CollectiveGroupOptions,
    CommunicationError,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementError,
    WorkerAddress,
)
from rlinf.scheduler.base.address import resolve_address
from rlinf.scheduler.base.config import DEFAULT_TIMEOUT, MAX_TIMEOUT, TIMEOUT_ENV, resolve_timeout
from rlinf.scheduler.plugins.placement import NodeInfo

from p2p_helpers import Peer, run_on

NODES = [NodeInfo(0, "127.0.0.1", 2), NodeInfo(1, "127.0.0.1", 2)]  # accelerators 0-1 on node 0, 2-3 on node 1
GPU_NODE = {0: 0, 1: 0, 2: 1, 3: 1}

# -- generators of valid and of invalid values, each with its documented refusal ----------------------------------
roots = st.text(min_size=1, max_size=10).filter(lambda s: ":" not in s and s == s.strip())
bad_roots = st.one_of(
    st.just(""),
    st.tuples(roots, roots).map(":".join),  # a separator inside
    roots.map(lambda s: " " + s), roots.map(lambda s: s + "\t"),  # surrounding whitespace
)
rank_paths = st.lists(st.integers(0, 10**6), max_size=4)
not_ints = st.one_of(st.booleans(), st.floats(), st.text(max_size=3), st.none())
anything = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=True), st.text(max_size=12),
                     st.lists(st.integers(-3, 5), max_size=4))
good_timeouts = st.one_of(st.integers(1, 10**9), st.floats(min_value=1e-9, max_value=1e9, allow_nan=False, allow_infinity=False))
bad_timeout_values = st.one_of(st.just(math.nan), st.just(math.inf), st.just(-math.inf), st.integers(-10**6, 0),
                               st.floats(max_value=0.0, allow_nan=False, allow_infinity=False))  # -> ValueError
bad_timeout_types = st.one_of(st.booleans(), st.text(max_size=5), st.lists(st.integers(), max_size=2),
                              st.just(b"1"), st.just(1j))  # -> TypeError


def timeout_error(value):
    """The exception the API documents for ``timeout=value``, or None when it is valid."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return TypeError
    if isinstance(value, int):
        return None if 0 < value <= MAX_TIMEOUT else ValueError
    return None if math.isfinite(value) and 0 < value <= MAX_TIMEOUT else ValueError


# -- addresses -----------------------------------------------------------------------------------------------------
@given(roots, rank_paths)
def test_valid_addresses_round_trip(root, ranks):
    addr = WorkerAddress(root, ranks)
    assert addr.root_group_name == root and addr.rank_path == ranks
    assert addr.get_name() == ":".join([root, *map(str, ranks)])
    assert WorkerAddress.from_name(addr.get_name()) == addr
    if ranks:
        assert addr.rank == ranks[-1]


@given(bad_roots, rank_paths)
def test_bad_root_names_are_refused(root, ranks):
    with pytest.raises(ValueError, match="invalid group name"):
        WorkerAddress(root, ranks)


@given(st.one_of(st.integers(), st.none(), st.lists(st.text(max_size=2), max_size=2), st.binary(max_size=3)))
def test_root_names_that_are_not_str_are_refused(root):
    with pytest.raises(TypeError, match="group name must be a str"):
        WorkerAddress(root)


@given(roots, rank_paths, st.integers(-10**6, -1), st.data())
def test_negative_ranks_are_refused(root, ranks, bad, data):
    at = data.draw(st.integers(0, len(ranks)))
    with pytest.raises(ValueError, match="rank must be >= 0"):
        WorkerAddress(root, ranks[:at] + [bad] + ranks[at:])


@given(roots, rank_paths, not_ints, st.data())
def test_ranks_that_are_not_ints_are_refused(root, ranks, bad, data):
    at = data.draw(st.integers(0, len(ranks)))
    with pytest.raises(TypeError):
        WorkerAddress(root, ranks[:at] + [bad] + ranks[at:])


@given(st.text(max_size=20))
def test_parsing_any_text_is_refused_or_canonical(name):
    try:
        addr = WorkerAddress.from_name(name)
    except ValueError:
        root, *parts = name.split(":") if name else ("",)
        valid_root = bool(root) and root == root.strip()
        assert not (valid_root and all(_is_int(p) and int(p) >= 0 for p in parts)), name
        return
    assert addr.root_group_name == name.split(":")[0]
    assert addr.rank_path == [int(p) for p in name.split(":")[1:]]
    assert WorkerAddress.from_name(addr.get_name()) == addr  # the printed form parses to the same address


def _is_int(text):
    try:
        int(text)
        return True
    except ValueError:
        return False


@given(roots, rank_paths, st.one_of(st.integers(0, 99), st.lists(st.integers(0, 99), min_size=1, max_size=3)))
def test_resolve_address_appends_the_rank_path(root, ranks, rank):
    group = WorkerAddress(root, ranks).get_name()
    addr = resolve_address(group, rank)
    assert addr.root_group_name == root
    assert addr.rank_path == ranks + ([rank] if isinstance(rank, int) else rank)


@given(roots, st.one_of(st.none(), st.just([]), st.integers(max_value=-1), st.booleans(), st.text(max_size=3), st.floats()))
def test_resolve_address_refuses_bad_ranks(root, rank):
    with pytest.raises((TypeError, ValueError)) as info:
        resolve_address(root, rank)
    if rank is None or rank in ([], ""):  # nothing to index the group with (a str is a sequence)
        assert info.type is ValueError and "no rank given" in str(info.value)
    elif isinstance(rank, int) and not isinstance(rank, bool):
        assert info.type is ValueError
    else:
        assert info.type is TypeError


# -- placements ----------------------------------------------------------------------------------------------------
@given(st.lists(st.integers(0, 3), min_size=1, max_size=8))
def test_node_placement_follows_the_list(node_ranks):
    try:
        placements = NodePlacementStrategy(node_ranks).get_placement(NODES)
    except PlacementError as exc:
        assert max(node_ranks) >= len(NODES) and f"node {max(node_ranks)}" in str(exc) or any(n >= 2 for n in node_ranks)
        return
    assert max(node_ranks) < len(NODES)
    assert [p.rank for p in placements] == list(range(len(node_ranks)))
    assert [p.node_rank for p in placements] == node_ranks
    for p in placements:
        assert p.local_rank == node_ranks[: p.rank].count(p.node_rank)
        assert p.local_world_size == node_ranks.count(p.node_rank)
        assert p.gpu_ids == () and p.local_gpu_ids == ()


@given(st.one_of(st.just([]), st.lists(st.integers(max_value=-1), min_size=1, max_size=3), st.just("01"), st.integers(0, 3)))
def test_node_placement_refuses_bad_lists(value):
    with pytest.raises(ValueError):
        NodePlacementStrategy(value)


@given(st.integers(0, 5), st.integers(0, 5), st.integers(1, 4), st.integers(1, 4))
def test_packed_placement(start, end, per, stride):
    count = end - start + 1
    if end < start or count % (per * stride):
        with pytest.raises(ValueError):
            PackedPlacementStrategy(start, end, per, stride)
        return
    strategy = PackedPlacementStrategy(start, end, per, stride)
    expected = []  # the documented layout: blocks of per*stride, each spread by stride
    for b in range(start, end + 1, per * stride):
        block = list(range(b, b + per * stride))
        expected += [tuple(block[s::stride]) for s in range(stride)]
    impossible = end > 3 or any(len({GPU_NODE[g] for g in gpus}) > 1 for gpus in expected)
    try:
        placements = strategy.get_placement(NODES)
    except PlacementError:
        assert impossible
        return
    assert not impossible
    assert [p.gpu_ids for p in placements] == expected
    assert [p.node_rank for p in placements] == [GPU_NODE[g[0]] for g in expected]
    assert [p.local_gpu_ids for p in placements] == [tuple(g % 2 for g in gpus) for gpus in expected]


@given(st.one_of(not_ints, st.integers(max_value=-1)), st.integers(0, 3))
def test_packed_placement_refuses_bad_numbers(bad, good):
    for args in ((bad, good), (good, bad), (0, 0, bad), (0, 0, 1, bad)):
        if len(args) > 2 and isinstance(bad, int) and not isinstance(bad, bool) and bad >= 1:
            continue
        with pytest.raises((TypeError, ValueError)) as info:
            PackedPlacementStrategy(*args)
        is_int = isinstance(bad, int) and not isinstance(bad, bool)
        if is_int:  # a ValueError that is also RLinf's AssertionError
            assert issubclass(info.type, ValueError) and issubclass(info.type, AssertionError), args
        else:
            assert info.type is TypeError, args


@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), min_size=1, max_size=3))
def test_flexible_placement(lists):
    flat = [g for inner in lists for g in inner]
    impossible = (max(flat) > 3 or len(set(flat)) != len(flat)
                  or any(len({GPU_NODE.get(g, -1) for g in inner}) > 1 for inner in lists))
    try:
        placements = FlexiblePlacementStrategy(lists).get_placement(NODES)
    except PlacementError:
        assert impossible
        return
    assert not impossible
    assert [list(p.gpu_ids) for p in placements] == lists
    assert [p.node_rank for p in placements] == [GPU_NODE[inner[0]] for inner in lists]


@given(st.one_of(st.just([]), st.just([[]]), st.just("ab"), st.lists(st.integers(0, 3), min_size=1, max_size=2)))
def test_flexible_placement_refuses_bad_shapes(value):
    with pytest.raises(ValueError):
        FlexiblePlacementStrategy(value)


# -- timeouts ------------------------------------------------------------------------------------------------------
@given(st.one_of(good_timeouts, bad_timeout_values, bad_timeout_types, st.none(), anything))
@example(math.nan)
@example(float("nan"))
@example(math.inf)
@example(-math.inf)
@example(True)
@example(0)
@example(10**400)
def test_timeouts(value):
    expected = timeout_error(value)
    if expected is None:
        got = resolve_timeout(value)
        assert isinstance(got, float) and math.isfinite(got) and got > 0
        assert got == (float(value) if value is not None else resolve_timeout(None))
        return
    with pytest.raises(expected, match="timeout must be"):
        resolve_timeout(value)


def test_default_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert resolve_timeout(None) == DEFAULT_TIMEOUT
    monkeypatch.setenv(TIMEOUT_ENV, "7.5")
    assert resolve_timeout(None) == 7.5
    for bad in ("nan", "inf", "-1", "0", "soon"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=TIMEOUT_ENV):
            resolve_timeout(None)


@given(st.one_of(st.none(), st.text(max_size=8), anything))
def test_transport_option(value):
    if value is None or isinstance(value, str) and value:
        assert CollectiveGroupOptions(transport=value).transport == value
        return
    with pytest.raises(ValueError, match="transport must be a non-empty str"):
        CollectiveGroupOptions(transport=value)


@given(st.one_of(good_timeouts, bad_timeout_values, bad_timeout_types, st.none()))
@example(math.nan)
def test_timeout_option(value):
    expected = timeout_error(value)
    if expected is None:
        assert CollectiveGroupOptions(timeout=value).timeout == value
    else:
        with pytest.raises(expected, match="timeout must be"):
            CollectiveGroupOptions(timeout=value)


# -- the public calls that take timeout=, on real workers ----------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_channel(cluster):
    return Channel.create("fuzz")


# keys follow dict-key rules: any hashable value (RLinf's router builds tuple keys); unhashable ones are refused
keys = st.one_of(st.text(min_size=1, max_size=8), st.none(), st.integers(), st.booleans(),
                 st.tuples(st.text(max_size=2), st.integers(-3, 3)))
bad_keys = st.one_of(st.just(""), st.lists(st.text(max_size=2), max_size=2),
                     st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.one_of(keys, bad_keys), weight=st.one_of(st.integers(0, 5), st.floats(0, 5)),
       timeout=st.one_of(good_timeouts.filter(lambda t: t >= 10), bad_timeout_values, bad_timeout_types, st.none()),
       item=st.one_of(st.integers(), st.text(max_size=20), st.lists(st.floats(allow_nan=False), max_size=4)))
@example(key="k", weight=1, timeout=math.nan, item=1)
def test_channel_arguments(fuzz_channel, key, weight, timeout, item):
    key_ok = not isinstance(key, (list, dict)) and key != ""
    expected = timeout_error(timeout) or (None if key_ok else TypeError)
    if expected is None:
        fuzz_channel.put(item, weight=weight, key=key, timeout=timeout)
        assert fuzz_channel.get(key=key, timeout=30) == item
        return
    with pytest.raises(expected):
        fuzz_channel.put(item, weight=weight, key=key, timeout=timeout)
    with pytest.raises(expected):
        fuzz_channel.get(key=key, timeout=timeout)
    if key_ok:
        assert fuzz_channel.qsize(key) == 0  # the refused put left nothing behind


@pytest.fixture(scope="module")
def fuzz_worker(cluster):
    g = Peer.create_group().launch(cluster, NodePlacementStrategy([0]), name="fuzz_worker")
    yield g
    g.stop()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 0, True, "5"])
def test_every_public_timeout_refuses_bad_values(cluster, fuzz_worker, fuzz_channel, bad):
    kind = timeout_error(bad)
    assert kind is not None
    pending = fuzz_worker.pid()
    with pytest.raises(kind, match="timeout"):
        pending.wait(timeout=bad)
    assert pending.wait(timeout=30)  # the refused wait changed nothing
    with pytest.raises(kind, match="timeout"):
        Channel.connect("fuzz", timeout=bad)
    with pytest.raises(kind, match="timeout"):
        Peer.create_group().launch(cluster, NodePlacementStrategy([0]), name="fuzz_never", timeout=bad)
    assert "fuzz_never" not in cluster.session.list_groups()  # refused before anything started

    def in_worker(w, bad):
        import torch

        out = []
        calls = [
            lambda: w.send("x", "fuzz_worker", 0, timeout=bad),
            lambda: w.recv("fuzz_worker", 0, timeout=bad),
            lambda: w.send_tensor(torch.ones(2), "fuzz_worker", 0, timeout=bad),
            lambda: w.recv_tensor(torch.ones(2), "fuzz_worker", 0, timeout=bad),
            lambda: w.send("x", "fuzz_worker", 0, async_op=True).wait(timeout=bad),
        ]
        for call in calls:
            try:
                call()
                out.append("accepted")
            except (TypeError, ValueError) as exc:
                out.append(type(exc).__name__ if "timeout" in str(exc) else repr(exc))
        return out

    got = run_on(fuzz_worker, 0, in_worker, bad).wait(timeout=60)[0]
    assert got[:4] == [kind.__name__] * 4, got
    # the async send to itself was accepted (it waits for a receiver); only its wait(timeout=bad) was refused
    assert got[4] == kind.__name__, got


def _try_all(w, cases):
    out = []
    for group, rank in cases:
        try:
            w.send("x", group, rank, timeout=2)
            out.append("sent")
        except (CommunicationError, TypeError, ValueError) as exc:
            out.append(type(exc).__name__ if not isinstance(exc, CommunicationError) else "CommunicationError")
    return out


def _expected_send_outcome(group, rank):
    if not isinstance(group, str):
        return "TypeError"  # send checks the group name's type before parsing it
    try:
        addr = resolve_address(group, rank)
    except (TypeError, ValueError) as exc:
        return type(exc).__name__
    assert addr.root_group_name != "fuzz_worker"  # filtered out below
    return "CommunicationError"  # a well-formed address of a group that does not exist


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.one_of(st.text(max_size=8), roots, st.integers(), st.none()), anything), min_size=1, max_size=15))
def test_point_to_point_arguments_in_a_worker(fuzz_worker, cases):
    cases = [(g, r) for g, r in cases if not (isinstance(g, str) and g.split(":")[0] == "fuzz_worker")]
    if not cases:
        return
    expected = [_expected_send_outcome(g, r) for g, r in cases]
    results = run_on(fuzz_worker, 0, _try_all, cases).wait(timeout=120)[0]
    assert results == expected
    assert fuzz_worker.pid().wait(timeout=30)  # the worker survived all of it
