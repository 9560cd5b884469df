"""Bad input, generated: every bad value gets a clear exception; no hang, no crash."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlinf.scheduler import (
    Channel,
    CollectiveGroupOptions,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementError,
    WorkerAddress,
)
from rlinf.scheduler.address import resolve_address
from rlinf.scheduler.config import resolve_timeout
from rlinf.scheduler.placement import NodeInfo

from p2p_helpers import Peer, run_on

NODES = [NodeInfo(0, "127.0.0.1", 2), NodeInfo(1, "127.0.0.1", 2)]
anything = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**12), st.floats(allow_nan=True), st.text(max_size=12),
                     st.lists(st.integers(-3, 5), max_size=4))


@given(st.one_of(st.text(max_size=12), st.none(), st.integers()), st.one_of(anything, st.lists(st.integers(-2, 9), max_size=4)))
def test_addresses(root, ranks):
    try:
        addr = WorkerAddress(root, ranks)
    except (TypeError, ValueError):
        return
    assert WorkerAddress.from_name(addr.get_name()) == addr


@given(st.text(max_size=20))
def test_address_names(name):
    try:
        addr = WorkerAddress.from_name(name)
    except (TypeError, ValueError):
        return
    assert addr.get_name() == name


@given(st.one_of(st.text(max_size=10), st.integers()), anything)
def test_resolve_address(group, rank):
    try:
        resolve_address(group, rank)
    except (TypeError, ValueError):
        pass


@given(anything, anything, anything, anything)
def test_packed_placement(a, b, c, d):
    try:
        PackedPlacementStrategy(a, b, c, d).get_placement(NODES)
    except (TypeError, ValueError, PlacementError):
        pass


@given(st.one_of(anything, st.lists(st.lists(st.integers(-2, 6), max_size=3), max_size=3)))
def test_flexible_and_node_placement(x):
    for make in (FlexiblePlacementStrategy, NodePlacementStrategy):
        try:
            make(x).get_placement(NODES)
        except (TypeError, ValueError, PlacementError):
            pass


@given(anything)
def test_timeouts(value):
    try:
        t = resolve_timeout(value)
    except (TypeError, ValueError):
        return
    assert t > 0 and not math.isnan(t) or value is None


@given(anything)
def test_transport_option(value):
    try:
        CollectiveGroupOptions(transport=value)
    except ValueError:
        pass


@pytest.fixture(scope="module")
def fuzz_channel(cluster):
    return Channel.create("fuzz")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=anything, weight=anything, timeout=anything)
def test_channel_arguments(fuzz_channel, key, weight, timeout):
    try:
        fuzz_channel.put("item", weight=weight, key=key, timeout=timeout)
    except (TypeError, ValueError):
        return
    assert fuzz_channel.get(key=key, timeout=10) == "item"


@pytest.fixture(scope="module")
def fuzz_worker(cluster):
    g = Peer.create_group().launch(cluster, NodePlacementStrategy([0]), name="fuzz_worker")
    yield g
    g.stop()


def _try_all(w, cases):
    from rlinf.scheduler import CommunicationError

    out = []
    for group, rank in cases:
        try:
            w.send("x", group, rank, timeout=2)
            out.append("sent")
        except (CommunicationError, TypeError, ValueError) as exc:
            out.append(type(exc).__name__)
    return out


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.one_of(st.text(max_size=8), st.integers(), st.none()), anything), min_size=1, max_size=15))
def test_point_to_point_arguments_in_a_worker(fuzz_worker, cases):
    cases = [(g, r) for g, r in cases if not (g == "fuzz_worker" and r == 0)]  # never block on a send to itself
    results = run_on(fuzz_worker, 0, _try_all, cases).wait(timeout=120)[0]
    assert len(results) == len(cases)
    assert fuzz_worker.pid().wait(timeout=30)  # the worker survived all of it
