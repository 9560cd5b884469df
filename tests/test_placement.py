import pytest

from rlinf.scheduler import FlexiblePlacementStrategy, NodePlacementStrategy, PackedPlacementStrategy, PlacementError
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
