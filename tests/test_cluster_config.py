"""RLinf's ``cluster`` section as ``ClusterConfig``: parsing (dict and OmegaConf), RLinf's validation
(every error both an ``AssertionError`` and a ``ValueError``), and ``Cluster(cluster_cfg=...)`` on the
shared cluster: node labels, hardware per node and ``NodePlacementStrategy(..., node_group_label=...)``."""

from __future__ import annotations

import copy

import pytest
from omegaconf import OmegaConf

from rlinf.scheduler import Cluster, NodePlacementStrategy, PlacementError, Worker, WorkerGroup
from rlinf.scheduler.cluster import ClusterConfig, NodeGroupConfig, parse_rank_config
from rlinf.scheduler.hardware import FrankaConfig, FrankaHWInfo

RLINF_EXAMPLE = {  # the example of RLinf's ClusterConfig docstring
    "num_nodes": 18,
    "component_placement": {"actor": {"node_group": "a800", "placement": "0-63"}},
    "node_groups": [
        {"label": "a800", "node_ranks": "0-7", "env_configs": [
            {"node_ranks": "0-7", "python_interpreter_path": "/opt/venv/openpi/bin/python3",
             "env_vars": [{"GLOO_SOCKET_IFNAME": "eth0"}]}]},
        {"label": 4090, "node_ranks": "8-15", "env_configs": [
            {"node_ranks": "8-15", "env_vars": [{"GLOO_SOCKET_IFNAME": "eth1"}]}]},
        {"label": "franka", "node_ranks": "16-17", "hardware": {"type": "Franka", "configs": [
            {"robot_ip": "10.10.10.1", "node_rank": 16, "camera_serials": ["322142001230", "322142001231"]},
            {"robot_ip": "10.10.10.2", "node_rank": 17, "camera_serials": ["322142001232"]}]}},
    ],
    "ignored_by_rlinf_too": 1,
}


@pytest.mark.parametrize("as_omegaconf", [False, True])
def test_rlinf_example_section(as_omegaconf):
    section = OmegaConf.create(RLINF_EXAMPLE) if as_omegaconf else copy.deepcopy(RLINF_EXAMPLE)
    cfg = ClusterConfig.from_dict_cfg(section)
    assert cfg.num_nodes == 18 and cfg.labels == ["a800", "4090", "franka"]
    a800, g4090, franka = cfg.node_groups
    assert isinstance(a800, NodeGroupConfig) and a800.node_ranks == list(range(8))
    assert a800.env_configs[0].env_vars == [{"GLOO_SOCKET_IFNAME": "eth0"}]
    assert g4090.get_node_env_vars(9) == {"GLOO_SOCKET_IFNAME": "eth1"} and g4090.get_node_env_vars(3) == {}
    assert cfg.get_node_python_interpreter_path_by_rank(3) == ["/opt/venv/openpi/bin/python3"]
    assert cfg.get_node_python_interpreter_path_by_rank(9) == []
    assert franka.hardware_type == "Franka" and franka.node_ranks == [16, 17]
    assert cfg.get_node_hw_configs_by_rank(17) == [
        FrankaConfig(node_rank=17, robot_ip="10.10.10.2", camera_serials=["322142001232"])]
    assert cfg.get_node_labels_by_rank(16) == ["franka"] and cfg.get_node_labels_by_rank(3) == ["a800"]
    assert cfg.component_placement == {"actor": {"node_group": "a800", "placement": "0-63"}}


def test_rank_expressions():
    assert parse_rank_config("0-2,5", range(8), "node") == [0, 1, 2, 5]
    assert parse_rank_config(3) == [3] and parse_rank_config([4, 1, 4]) == [1, 4]
    assert parse_rank_config("all", [2, 3]) == [2, 3]


def group(**fields):
    return {"label": "g", "node_ranks": "0-1", **fields}


def franka(*configs):
    return {"type": "Franka", "configs": list(configs)}


BAD = [
    ({"num_nodes": 0}, "num_nodes must be a positive integer"),
    ({"component_placement": {}}, r"Missing fields \['num_nodes'\]"),
    ({"num_nodes": 2, "node_groups": [{"label": "g"}]}, r"Missing fields \['node_ranks'\]"),
    ({"num_nodes": 2, "node_groups": [group(gpus=2)]}, r"Unknown fields \['gpus'\]"),
    ({"num_nodes": 2, "node_groups": [group(label="node")]}, "'node' is reserved"),
    ({"num_nodes": 2, "node_groups": [group(label="cluster")]}, "'cluster' is reserved"),
    ({"num_nodes": 2, "node_groups": [group(), group()]}, r"labels must be unique; repeated: \['g'\]"),
    ({"num_nodes": 2, "node_groups": [group(node_ranks="0-2")]}, "within the available node ranks"),
    ({"num_nodes": 2, "node_groups": [group(node_ranks="1-0")]}, "less than or equal to end rank"),
    ({"num_nodes": 2, "node_groups": [group(node_ranks="a-b")]}, "Invalid node rank format"),
    ({"num_nodes": 3, "node_groups": [group(env_configs=[{"node_ranks": 2}])]}, "within the group's nodes"),
    ({"num_nodes": 2, "node_groups": [group(env_configs=[{"node_ranks": "0-1"}, {"node_ranks": 1}])]},
     r"Node ranks \[1\] appear in several env_configs"),
    ({"num_nodes": 2, "node_groups": [group(env_configs=[{"node_ranks": 0, "env_vars": [{"A": 1}]},
                                                         {"node_ranks": 1, "env_vars": [{"A": 2}]}])]},
     "'A' is set twice"),
    ({"num_nodes": 2, "node_groups": [group(env_configs=[{"node_ranks": 0, "env_vars": {"A": 1}}])]},
     "perhaps a '-' is missing"),
    ({"num_nodes": 2, "node_groups": [group(env_configs=[{"node_ranks": 0, "env_vars": [{"A": 1, "B": 2}]}])]},
     "exactly one key"),
    ({"num_nodes": 2, "node_groups": [group(env_configs={"node_ranks": 0})]}, "must be a list of dicts"),
    ({"num_nodes": 2, "node_groups": [group(hardware=franka({"node_rank": 2}))]},
     r"node_rank 2 in a Franka hardware config must be within node_ranks \[0, 1\]"),
    ({"num_nodes": 2, "node_groups": [group(hardware=franka({"node_rank": 0})),
                                      group(label="h", hardware=franka({"node_rank": 0}))]},
     "hardware of node 0 in two node groups"),
    ({"num_nodes": 2, "node_groups": [group(hardware={"type": "Roomba", "configs": []})]},
     r"Unsupported hardware type: 'Roomba'. Installed hardware types: \['DOSW1'"),
    ({"num_nodes": 2, "node_groups": [group(hardware=franka({"node_rank": 0}), ignore_hardware=True)]},
     "ignore_hardware"),
    ({"num_nodes": 2, "node_groups": [group(hardware=franka({"node_rank": 0}), hardware_type="Franka")]},
     "hardware_type must not be given"),
    ({"num_nodes": 2, "node_groups": [group(hardware=franka({"node_rank": 0, "robot_ip": "10.0.0.300"}))]},
     "'robot_ip' in franka config must be a valid IP address"),
    ({"num_nodes": 2, "node_groups": [group(hardware=franka({"node_rank": 0}, {"node_rank": 0}))]},
     "Duplicate hardware configs"),
    ({"num_nodes": 2, "node_groups": [group(hardware=franka({"node_rank": 0, "ip": "x"}))]},
     r"Unknown fields \['ip'\] in Franka hardware config"),
    ({"num_nodes": 2, "node_groups": [group(hardware=franka({"node_rank": "0"}))]}, "must be an integer"),
    ({"num_nodes": 2, "node_groups": [group(hardware={"type": "GimArm", "configs": [
        {"node_rank": 0, "arm_variant": "big"}]})]}, "'arm_variant' must be 'gim_arm' or 'gim_arm_xl'"),
]


@pytest.mark.parametrize("section, message", BAD)
@pytest.mark.parametrize("caught", [AssertionError, ValueError])
def test_invalid_sections_are_refused(section, message, caught):
    with pytest.raises(caught, match=message):
        ClusterConfig.from_dict_cfg(section)


def test_cluster_refuses_an_invalid_section_before_connecting():
    with pytest.raises(AssertionError, match="cluster_cfg.*'node' is reserved"):
        Cluster(cluster_cfg={"num_nodes": 1, "node_groups": [{"label": "node", "node_ranks": 0}]})


class Where(Worker):
    def __init__(self):
        super().__init__()

    def node(self):
        return self.worker_info.cluster_node_rank


@pytest.fixture
def arm_cluster(cluster):
    """The shared cluster seen through a cluster config with a Franka on node 0 (the session's own config
    is put back afterwards, so later ``Cluster()`` objects are unaffected)."""
    before = cluster.session.cluster_cfg
    section = OmegaConf.create({"num_nodes": 1, "node_groups": [
        {"label": "arm", "node_ranks": 0, "hardware": {"type": "Franka", "configs": [
            {"node_rank": 0, "robot_ip": "10.10.10.1", "disable_validate": True}]}},
        {"label": "cpu", "node_ranks": "all", "env_configs": [{"node_ranks": 0, "env_vars": [{"X": "1"}]}]}]})
    try:
        yield Cluster(cluster_cfg=section)
    finally:
        cluster.session.cluster_cfg = before


def test_cluster_exposes_the_config_labels_and_hardware(arm_cluster):
    config = arm_cluster.cluster_config
    assert isinstance(config, ClusterConfig) and config.labels == ["arm", "cpu"]
    node = arm_cluster.get_node_info(0)
    assert node.node_labels == ("arm", "cpu")
    (robots,) = [r for r in node.hardware_resources if r.type == "Franka"]
    assert robots.count == 1 and isinstance(robots.infos[0], FrankaHWInfo)
    assert robots.infos[0].config.robot_ip == "10.10.10.1"


def test_node_group_label_placement_on_the_shared_cluster(arm_cluster):
    g = Where.create_group().launch(arm_cluster, NodePlacementStrategy([0, 0], node_group_label="arm"),
                                    name="ng_label_arm")
    try:
        assert g.node().wait(timeout=60) == [0, 0]
    finally:
        WorkerGroup.stop(g)
    with pytest.raises(PlacementError, match="node group 'gpu' not found.*'arm', 'cluster', 'cpu', 'node'"):
        Where.create_group().launch(arm_cluster, NodePlacementStrategy([0], node_group_label="gpu"), name="ng_gpu")
    with pytest.raises(AssertionError, match=r"asks for node 1, but node group\(s\) \['cpu'\] have 1 node"):
        Where.create_group().launch(arm_cluster, NodePlacementStrategy([1], node_group_label="cpu"), name="ng_cpu")


def test_flexible_and_packed_node_groups_on_the_shared_cluster(arm_cluster):
    from rlinf.scheduler import FlexiblePlacementStrategy, PackedPlacementStrategy

    g = Where.create_group().launch(arm_cluster, FlexiblePlacementStrategy([[0]], node_group_label="cpu"),
                                    name="ng_flex_cpu")  # a CPU-only group: its ranks are its nodes
    try:
        assert g.node().wait(timeout=60) == [0]
    finally:
        WorkerGroup.stop(g)
    with pytest.raises(AssertionError, match="node group 'cpu' has no hardware"):
        Where.create_group().launch(arm_cluster, PackedPlacementStrategy(0, 0, node_group="cpu"), name="ng_packed")
