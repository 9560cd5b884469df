"""RLinf's config-driven component placement: ``cluster.component_placement`` strings to
strategies and world sizes, with the mode they describe and RLinf's validation errors.

Plans are made for lists of ``NodeInfo`` (a cluster one is not connected to), and once for
the running test cluster with a real launch."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from rlinf.scheduler import (
    ComponentPlacement,
    FlexiblePlacementStrategy,
    HybridComponentPlacement,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementError,
    PlacementMode,
    Worker,
    WorkerGroup,
)
from rlinf.scheduler.plugins.placement import NodeInfo

TWO_GPU_NODES = [NodeInfo(0, "10.0.0.1", 4), NodeInfo(1, "10.0.0.2", 4)]
CPU_NODES = [NodeInfo(0, "10.0.0.1", 0), NodeInfo(1, "10.0.0.2", 0)]


def cfg(placement: dict, num_nodes: int = 2):
    return OmegaConf.create({"cluster": {"num_nodes": num_nodes, "component_placement": placement}})


def gpus(strategy, nodes=TWO_GPU_NODES):
    return [p.gpu_ids for p in strategy.get_placement(nodes)]


def test_collocated_components_share_every_gpu():
    p = ComponentPlacement(cfg({"actor,rollout": "0-7"}), TWO_GPU_NODES)
    assert p.placement_mode is PlacementMode.COLLOCATED
    assert p.components == ["actor", "rollout"]
    for name in ("actor", "rollout"):
        assert p.get_world_size(name) == 8
        assert isinstance(p.get_strategy(name), PackedPlacementStrategy)
        assert gpus(p.get_strategy(name)) == [(g,) for g in range(8)]


def test_disaggregated_components_and_processes_spanning_gpus():
    p = ComponentPlacement(cfg({"actor": "0-3", "rollout": "4-7:0-1", "reward": 7 - 7}), [NodeInfo(0, "a", 8)])
    assert p.placement_mode is PlacementMode.HYBRID  # reward's GPU 0 is also actor's
    p = ComponentPlacement(cfg({"actor": "0-3", "rollout": "4-7:0-1"}), TWO_GPU_NODES)
    assert p.placement_mode is PlacementMode.DISAGGREGATED
    assert p.get_world_size("rollout") == 2
    assert gpus(p.get_strategy("rollout")) == [(4, 5), (6, 7)]
    assert p.get_hardware_ranks("actor") == [0, 1, 2, 3]


def test_hybrid_placement_dict_entries_all_and_gpu_lists():
    config = cfg({"env": {"placement": "0,2"}, "rollout": "1,3", "actor": "all"})
    p = HybridComponentPlacement(config, TWO_GPU_NODES)
    assert p.placement_mode is PlacementMode.HYBRID
    assert isinstance(p.get_strategy("env"), FlexiblePlacementStrategy)
    assert gpus(p.get_strategy("env")) == [(0,), (2,)]
    assert p.get_world_size("actor") == 8
    # the cluster section alone, as a plain dict, reads the same
    q = HybridComponentPlacement({"component_placement": {"actor": "all"}}, TWO_GPU_NODES)
    assert q.get_world_size("actor") == 8


def test_cpu_cluster_resources_are_nodes():
    p = ComponentPlacement(cfg({"actor,rollout": "0:0-3", "env": "0-1"}), CPU_NODES)
    assert p.get_world_size("actor") == 4
    assert isinstance(p.get_strategy("actor"), NodePlacementStrategy)
    assert [x.node_rank for x in p.get_strategy("actor").get_placement(CPU_NODES)] == [0, 0, 0, 0]
    assert [x.node_rank for x in p.get_strategy("env").get_placement(CPU_NODES)] == [0, 1]
    assert p.placement_mode is PlacementMode.HYBRID


@pytest.mark.parametrize(
    "placement, nodes, message",
    [
        ({"actor": "0-8"}, TWO_GPU_NODES, "End GPU ID 8 must be less than total number of GPUs 8"),
        ({"actor": "8"}, TWO_GPU_NODES, "Start GPU ID 8 must be less than total number of GPUs 8"),
        ({"actor": "5-2"}, TWO_GPU_NODES, "must be less than or equal to end GPU ID"),
        ({"actor": "0-x"}, TWO_GPU_NODES, "Invalid GPU range for components"),
        ({"actor": "0-2:0-1"}, TWO_GPU_NODES, "do not spread evenly"),
        ({"actor": "0-1:0-3"}, TWO_GPU_NODES, "processes per accelerator"),
        ({"actor": "3-6:0-1"}, TWO_GPU_NODES, "span nodes"),
        ({"actor": "0-3:1-4"}, TWO_GPU_NODES, "must be 0..N-1"),
        ({"actor": "0", "actor,rollout": "1"}, TWO_GPU_NODES, "placed more than once"),
        ({"actor": {"node_group": "a800", "placement": "0-3"}}, TWO_GPU_NODES, "node groups"),
        ({"actor": "0-1:0"}, CPU_NODES, "cannot span"),
        ({"actor": "0-2"}, CPU_NODES, "End node ID 2"),
    ],
)
def test_invalid_placements_are_refused_before_anything_starts(placement, nodes, message):
    with pytest.raises(PlacementError, match=message):
        ComponentPlacement(cfg(placement), nodes)
    # RLinf asserts: programs catching AssertionError (or ValueError) keep working
    with pytest.raises(AssertionError, match=message):
        ComponentPlacement(cfg(placement), nodes)
    with pytest.raises(ValueError, match=message):
        ComponentPlacement(cfg(placement), nodes)


def test_unknown_component_and_missing_section():
    p = ComponentPlacement(cfg({"actor": "0-3"}), TWO_GPU_NODES)
    with pytest.raises(PlacementError, match="Component critic does not exist"):
        p.get_strategy("critic")
    with pytest.raises(AssertionError, match="Component critic does not exist"):
        p.get_world_size("critic")
    with pytest.raises(PlacementError, match="component_placement"):
        ComponentPlacement(OmegaConf.create({"cluster": {"num_nodes": 1}}), TWO_GPU_NODES)


class Member(Worker):
    def __init__(self):
        super().__init__()

    def where(self):
        return self.worker_info.cluster_node_rank, self._world_size


def test_strategies_launch_on_the_running_cluster(cluster):
    p = HybridComponentPlacement(cfg({"actor,rollout": "0:0-1"}, num_nodes=1), cluster)
    g = Member.create_group().launch(cluster, placement_strategy=p.get_strategy("actor"), name="cp_actor")
    try:
        assert g.where().wait(timeout=60) == [(0, p.get_world_size("actor"))] * 2
    finally:
        WorkerGroup.stop(g)
