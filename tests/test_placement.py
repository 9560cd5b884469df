import pytest

from rlinf.scheduler import FlexiblePlacementStrategy, NodePlacementStrategy, PackedPlacementStrategy, PlacementError
from rlinf.scheduler.base.errors import PlacementArgumentError
from rlinf.scheduler.plugins.placement import NodeInfo, default_placement

TWO_GPU_NODES = [NodeInfo(0, "10.0.0.1", 4), NodeInfo(1, "10.0.0.2", 4)]
CPU_NODES = [NodeInfo(0, "127.0.0.1", 0), NodeInfo(1, "127.0.0.1", 0)]


def test_packed_spans_nodes_in_global_order():
    ps = PackedPlacementStrategy(2, 5).get_placement(TWO_GPU_NODES)
    assert [(p.node_rank, p.local_gpu_ids, p.gpu_ids) for p in ps] == [
        (0, (2,), (2,)), (0, (3,), (3,)), (1, (0,), (4,)), (1, (1,), (5,))]
    assert [p.local_rank for p in ps] == [0, 1, 0, 1]
    assert [p.local_world_size for p in ps] == [2, 2, 2, 2]


def test_packed_stride():
    ps = PackedPlacementStrategy(0, 3, num_hardware_per_process=2, stride=2).get_placement(TWO_GPU_NODES)
    assert [p.gpu_ids for p in ps] == [(0, 2), (1, 3)]


def test_packed_process_may_not_span_nodes():
    with pytest.raises(PlacementError, match="span"):
        PackedPlacementStrategy(2, 5, num_hardware_per_process=4).get_placement(TWO_GPU_NODES)


def test_more_gpus_than_exist():
    with pytest.raises(PlacementError, match="accelerator 8"):
        PackedPlacementStrategy(0, 8, num_hardware_per_process=1).get_placement(TWO_GPU_NODES)
    with pytest.raises(PlacementError, match="0 accelerator"):
        PackedPlacementStrategy(0, 0).get_placement(CPU_NODES)


def test_node_placement():
    ps = NodePlacementStrategy([0, 1, 1]).get_placement(CPU_NODES)
    assert [(p.rank, p.node_rank, p.local_rank, p.local_world_size) for p in ps] == [(0, 0, 0, 1), (1, 1, 0, 2), (2, 1, 1, 2)]
    assert all(p.gpu_ids == () for p in ps)
    with pytest.raises(PlacementError, match="node 2"):
        NodePlacementStrategy([0, 2]).get_placement(CPU_NODES)


def test_flexible():
    ps = FlexiblePlacementStrategy([[0, 1], [5]]).get_placement(TWO_GPU_NODES)
    assert [(p.node_rank, p.local_gpu_ids) for p in ps] == [(0, (0, 1)), (1, (1,))]
    with pytest.raises(PlacementError, match="more than one"):
        FlexiblePlacementStrategy([[0], [0]]).get_placement(TWO_GPU_NODES)


def test_default_placement():
    assert len(default_placement(TWO_GPU_NODES).get_placement(TWO_GPU_NODES)) == 8
    assert [p.node_rank for p in default_placement(CPU_NODES).get_placement(CPU_NODES)] == [0]


@pytest.mark.parametrize("make", [
    lambda: PackedPlacementStrategy(3, 1),
    lambda: PackedPlacementStrategy(0, 2, num_hardware_per_process=2),
    lambda: PackedPlacementStrategy(-1, 2),
    lambda: NodePlacementStrategy([]),
    lambda: NodePlacementStrategy([0, -1]),
    lambda: FlexiblePlacementStrategy([]),
    lambda: FlexiblePlacementStrategy([[]]),
])
def test_bad_arguments(make):
    with pytest.raises((ValueError, TypeError)):
        make()


BAD_ARGUMENTS = [  # RLinf asserts on each of these; rlinf raises PlacementArgumentError (ValueError and AssertionError)
    (lambda: PackedPlacementStrategy(3, 1), "end_hardware_rank"),
    (lambda: PackedPlacementStrategy(0, 2, num_hardware_per_process=2), "do not split"),
    (lambda: PackedPlacementStrategy(-1, 2), "start_hardware_rank must be >= 0"),
    (lambda: PackedPlacementStrategy(0, 3, stride=0), "stride must be >= 1"),
    (lambda: NodePlacementStrategy([]), "non-empty"),
    (lambda: NodePlacementStrategy([0, -1]), "node rank must be >= 0"),
    (lambda: NodePlacementStrategy([0], node_group_label=""), "node_group_label"),
    (lambda: FlexiblePlacementStrategy([]), "non-empty"),
    (lambda: FlexiblePlacementStrategy([[]]), "non-empty list"),
    (lambda: FlexiblePlacementStrategy([[0, -2]]), "accelerator rank must be >= 0"),
]


@pytest.mark.parametrize("make, message", BAD_ARGUMENTS)
@pytest.mark.parametrize("caught", [AssertionError, ValueError, PlacementError, PlacementArgumentError])
def test_bad_arguments_are_both_assertion_and_value_errors(make, message, caught):
    with pytest.raises(caught, match=message):
        make()


LABELLED = [NodeInfo(0, "10.0.0.1", 0, node_labels=("a",)), NodeInfo(1, "10.0.0.2", 0, node_labels=("b",)),
            NodeInfo(2, "10.0.0.3", 0, node_labels=("a", "c"))]


def test_node_placement_within_node_groups():
    ranks = lambda s: [p.node_rank for p in s.get_placement(LABELLED)]  # noqa: E731
    assert ranks(NodePlacementStrategy([1, 0], node_group_label="a")) == [2, 0]  # group-local ranks
    assert ranks(NodePlacementStrategy([0, 1, 2], node_group_label=["b", "a"])) == [1, 0, 2]
    assert ranks(NodePlacementStrategy([2], node_group_label="node")) == [2]  # every node
    assert ranks(NodePlacementStrategy([2])) == [2]  # global ranks without a label
    with pytest.raises(PlacementError, match="node group 'gpu' not found"):
        NodePlacementStrategy([0], node_group_label="gpu").get_placement(LABELLED)
    with pytest.raises(AssertionError, match="share nodes"):
        NodePlacementStrategy([0], node_group_label=["a", "c"]).get_placement(LABELLED)
    with pytest.raises(ValueError, match=r"asks for node 2, but node group\(s\) \['a'\] have 2 node"):
        NodePlacementStrategy([2], node_group_label="a").get_placement(LABELLED)
