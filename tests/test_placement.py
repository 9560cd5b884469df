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


def _robots(node_rank, count):
    from rlinf.scheduler.plugins.hardware import HardwareInfo, HardwareResource
    return HardwareResource("Franka", [HardwareInfo("Franka", f"arm{node_rank}.{i}") for i in range(count)])


# node 0: 4 GPUs (group "gpu"); node 1: 2 GPUs and 3 robots (groups "gpu" and "arms"); node 2: CPU only ("cpu")
GROUPED = [
    NodeInfo(0, "10.0.0.1", 4, node_labels=("gpu",)),
    NodeInfo(1, "10.0.0.2", 2, node_labels=("gpu", "arms"), hardware_resources=(_robots(1, 3),),
             node_group_hardware=(("arms", "Franka"),)),
    NodeInfo(2, "10.0.0.3", 0, node_labels=("cpu",)),
]


def test_packed_within_node_groups_counts_the_groups_hardware():
    ps = PackedPlacementStrategy(3, 5, node_group="gpu").get_placement(GROUPED)  # group-local accelerator ranks
    assert [(p.node_rank, p.local_gpu_ids, p.gpu_ids) for p in ps] == [(0, (3,), (3,)), (1, (0,), (4,)), (1, (1,), (5,))]
    assert {p.node_group_label for p in ps} == {"gpu"} and ps[0].hardware_type == "Accelerator"
    arms = PackedPlacementStrategy(0, 2, node_group="arms").get_placement(GROUPED)  # the group's robots
    assert [(p.node_rank, p.gpu_ids, p.local_hardware_ranks) for p in arms] == [(1, (), (0,)), (1, (), (1,)), (1, (), (2,))]
    assert [p.hardware_infos[0].model for p in arms] == ["arm1.0", "arm1.1", "arm1.2"]
    both = PackedPlacementStrategy(0, 3, node_group=["arms", "gpu"]).get_placement(GROUPED)
    assert [(p.node_group_label, p.hardware_type, p.local_hardware_ranks) for p in both] == [
        ("arms", "Franka", (0,)), ("arms", "Franka", (1,)), ("arms", "Franka", (2,)), ("gpu", "Accelerator", (0,))]
    assert repr(PackedPlacementStrategy(0, 1, node_group="arms")).endswith("stride=1, node_group='arms')")


def test_packed_within_node_groups_refusals():
    with pytest.raises(PlacementError, match=r"hardware rank 6, but node group\(s\) \['gpu'\] have 6"):
        PackedPlacementStrategy(0, 6, node_group="gpu").get_placement(GROUPED)
    with pytest.raises(PlacementError, match="span nodes"):
        PackedPlacementStrategy(3, 4, num_hardware_per_process=2, node_group="gpu").get_placement(GROUPED)
    with pytest.raises(AssertionError, match="node group 'cpu' has no hardware"):
        PackedPlacementStrategy(0, 0, node_group="cpu").get_placement(GROUPED)
    with pytest.raises(PlacementError, match="node group 'tpu' not found"):
        PackedPlacementStrategy(0, 0, node_group="tpu").get_placement(GROUPED)
    with pytest.raises(PlacementError, match="different node groups or kinds"):
        FlexiblePlacementStrategy([[2, 7]], node_group_label=["arms", "gpu"]).get_placement(GROUPED)  # both node 1
    with pytest.raises(ValueError, match="node_group must name node groups"):
        PackedPlacementStrategy(0, 0, node_group=[])


def test_flexible_within_node_groups():
    ps = FlexiblePlacementStrategy([[4, 5], [0]], node_group_label="gpu").get_placement(GROUPED)
    assert [(p.node_rank, p.local_gpu_ids, p.gpu_ids) for p in ps] == [(1, (0, 1), (4, 5)), (0, (0,), (0,))]
    cpu = FlexiblePlacementStrategy([[0], [1]], node_group_label=["cpu", "arms"]).get_placement(GROUPED)
    assert [(p.node_rank, p.gpu_ids, p.hardware_type, p.node_group_label) for p in cpu] == [
        (2, (), "", "cpu"), (1, (), "Franka", "arms")]  # a CPU group's ranks are its nodes
    assert repr(FlexiblePlacementStrategy([[0]], node_group_label=["cpu", "arms"])) == (
        "FlexiblePlacementStrategy([[0]], node_group_label=['cpu', 'arms'])")
    with pytest.raises(PlacementError, match="more than one process"):
        FlexiblePlacementStrategy([[0], [0]], node_group_label="arms").get_placement(GROUPED)
    with pytest.raises(PlacementError, match="share the Accelerator hardware of nodes"):
        FlexiblePlacementStrategy([[0]], node_group_label=["gpu", "cluster"]).get_placement(GROUPED)


def test_global_ranks_carry_the_accelerator_infos():
    from rlinf.scheduler.plugins.hardware import accelerator_resource
    nodes = [NodeInfo(0, "10.0.0.1", 2, hardware_resources=(accelerator_resource(2, "nvidia", "NV_GPU"),))]
    (p,) = PackedPlacementStrategy(1, 1).get_placement(nodes)
    assert p.local_hardware_ranks == (1,) and p.hardware_infos[0].model == "NV_GPU:nvidia"
