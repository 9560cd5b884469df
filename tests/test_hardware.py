"""Hardware kinds as plugins: the ``rlinf_register_hardware`` hook, RLinf's robots shipped through it and
enumerated from a node-group config, a third-party robot added the same way, and ``AcceleratorType`` /
``AcceleratorUtil`` answered by the accelerator plugins (this machine has none: ``NO_ACCEL``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlinf.scheduler.cluster import ClusterConfig
from rlinf.scheduler.hardware import (
    AcceleratorType,
    AcceleratorUtil,
    FrankaConfig,
    FrankaHWInfo,
    GimArmHWInfo,
    HardwareInfo,
    HardwarePlugin,
    Turtle2HWInfo,
)
from rlinf.scheduler.plugins import get_registry
from rlinf.scheduler.plugins import hardware as hw

ROBOTS = ["DOSW1", "DualFranka", "Franka", "GimArm", "Turtle2"]


def test_robots_ship_through_the_hardware_hook():
    provided = get_registry().provided["hardware"]
    assert sorted(provided) == ROBOTS
    for name in ROBOTS:
        entry = provided[name]
        assert entry.source.distribution == "rlinf-core" and entry.source.entry_point == "robots"
        assert isinstance(entry.descriptor, HardwarePlugin) and entry.unusable_reason() is None
        assert issubclass(entry.descriptor.info_class, HardwareInfo)
    assert [k.name for k in hw.kinds()] == ROBOTS
    assert hw.get("franka").name == "Franka"  # case-insensitive when unambiguous


def test_robots_enumerated_per_node_from_node_groups():
    config = ClusterConfig.from_dict_cfg({
        "num_nodes": 3,
        "node_groups": [
            {"label": "franka", "node_ranks": "0-1", "hardware": {"type": "Franka", "configs": [
                {"node_rank": 0, "robot_ip": "10.10.10.1", "camera_serials": [322142001230]},
                {"node_rank": 0, "robot_ip": "10.10.10.2"},
                {"node_rank": 1, "robot_ip": "10.10.10.3"}]}},
            {"label": "gim", "node_ranks": 2, "hardware": {"type": "GimArm", "configs": [
                {"node_rank": 2, "arm_variant": "gim_arm"}]}},
            {"label": "turtle", "node_ranks": 2, "hardware": {"type": "Turtle2", "configs": [{"node_rank": 2}]}},
        ],
    })
    node0 = hw.enumerate_node(0, config.get_node_hw_configs_by_type(0), hw.accelerator_resource(2, "nvidia", "NV_GPU"))
    assert [(r.type, r.count) for r in node0] == [("Accelerator", 2), ("Franka", 2)]
    assert node0[0].infos[0] == HardwareInfo("Accelerator", "NV_GPU:nvidia")
    arms = node0[1].infos
    assert all(isinstance(i, FrankaHWInfo) and i.type == i.model == "Franka" for i in arms)
    assert [i.config.robot_ip for i in arms] == ["10.10.10.1", "10.10.10.2"]
    assert arms[0].config == FrankaConfig(node_rank=0, robot_ip="10.10.10.1", camera_serials=["322142001230"])
    node2 = hw.enumerate_node(2, config.get_node_hw_configs_by_type(2))
    assert [(r.type, r.count) for r in node2] == [("GimArm", 1), ("Turtle2", 1)]
    assert isinstance(node2[0].infos[0], GimArmHWInfo) and node2[0].infos[0].model == "GimArm_gim_arm"
    assert isinstance(node2[1].infos[0], Turtle2HWInfo)
    assert config.get_node_labels_by_rank(2) == ["gim", "turtle"]


THIRD_PARTY = '''
from dataclasses import dataclass
from rlinf.scheduler.hardware import HardwareConfig, HardwareInfo, HardwarePlugin, hookimpl

@dataclass
class ArmConfig(HardwareConfig):
    port: str = "/dev/ttyUSB0"

@dataclass
class ArmInfo(HardwareInfo):
    config: ArmConfig

def _enumerate(node_rank, configs):
    return [ArmInfo(type="MyArm", model="MyArm@" + c.port, config=c) for c in configs]

@hookimpl
def rlinf_register_hardware():
    return [HardwarePlugin(name="MyArm", config_class=ArmConfig, info_class=ArmInfo, enumerate=_enumerate)]
'''

PROGRAM = '''
from rlinf.scheduler.cluster import ClusterConfig
from rlinf.scheduler.plugins import hardware as hw
cfg = ClusterConfig.from_dict_cfg({"num_nodes": 2, "node_groups": [{"label": "arms", "node_ranks": "0-1",
      "hardware": {"type": "MyArm", "configs": [{"node_rank": 1, "port": "/dev/ttyUSB7"}]}}]})
(res,) = hw.enumerate_node(1, cfg.get_node_hw_configs_by_type(1))
print(res.type, res.count, res.infos[0].model, type(res.infos[0]).__module__)
try:
    ClusterConfig.from_dict_cfg({"num_nodes": 1, "node_groups": [{"label": "arms", "node_ranks": 0,
        "hardware": {"type": "MyArm", "configs": [{"node_rank": 0, "baud": 9600}]}}]})
except AssertionError as exc:
    print("refused", "baud" in str(exc))
'''


def test_third_party_robot_plugin(tmp_path):
    """A robot type from a module of its own: parsed from the config, enumerated, listed."""
    (tmp_path / "my_arm_plugin.py").write_text(THIRD_PARTY)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               RLINF_PLUGINS="myarm=my_arm_plugin")
    out = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, env=env)
    assert out.stdout.split() == ["MyArm", "1", "MyArm@/dev/ttyUSB7", "my_arm_plugin", "refused", "True"], (
        out.stdout + out.stderr)
    listed = subprocess.run([sys.executable, "-m", "rlinf.scheduler", "plugins"], capture_output=True, text=True,
                            timeout=60, env=env)
    row = next((line for line in listed.stdout.splitlines() if line.startswith("MyArm ")), "")
    assert "hardware" in row and "yes" in row.split(), listed.stdout
    # without the plugin the type is unknown, and the error lists what is installed
    with pytest.raises(ValueError, match=r"Unsupported hardware type: 'MyArm'.*Franka"):
        hw.get("MyArm")


def test_accelerator_type_and_util_without_an_accelerator():
    assert AcceleratorUtil.get_accelerator_type() is AcceleratorType.NO_ACCEL
    assert AcceleratorType.NO_ACCEL == "NO_ACCEL"  # a str enum, as RLinf's
    none = AcceleratorType.NO_ACCEL
    assert AcceleratorUtil.get_torch_platform(none) is None
    assert AcceleratorUtil.get_device_type(none) is None
    assert AcceleratorUtil.get_ccl_backend(none) is None
    assert AcceleratorUtil.get_ccl_socket_ifname_env_var(none) == "GLOO_SOCKET_IFNAME"
    assert AcceleratorUtil.get_accelerator_env_var(none, ["0"]) == {}
    assert AcceleratorUtil.get_visible_devices(none) == []
    assert AcceleratorUtil.get_accel_pg_options(none, None) is None
    with AcceleratorUtil.profiling_range(none, "step"):
        pass


def test_accelerator_types_map_onto_the_plugin_kinds(monkeypatch):
    assert AcceleratorUtil.get_device_type(AcceleratorType.NV_GPU) == "cuda"
    assert AcceleratorUtil.get_ccl_backend("NV_GPU") == "nccl"
    assert AcceleratorUtil.get_ccl_socket_ifname_env_var(AcceleratorType.NV_GPU) == "NCCL_SOCKET_IFNAME"
    assert AcceleratorUtil.get_device_type(AcceleratorType.AMD_GPU) == "cuda"
    assert AcceleratorUtil.get_ccl_backend(AcceleratorType.NPU) == "hccl"
    assert AcceleratorUtil.get_accelerator_env_var(AcceleratorType.NV_GPU, ["2", "3"]) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1,0")
    assert AcceleratorUtil.get_visible_devices(AcceleratorType.AMD_GPU) == [1, 0]
    import torch

    assert AcceleratorUtil.get_torch_platform(AcceleratorType.NV_GPU) is torch.cuda
    with pytest.raises(ValueError, match="Unsupported accelerator type: 'INTEL_GPU'"):
        AcceleratorUtil.get_device_type(AcceleratorType.INTEL_GPU)
