"""RLinf's robots as a hardware plugin of rlinf-core, registered exactly as a third-party plugin would.

Each robot is a ``HardwarePlugin``: the type name a node group's
``hardware.type`` gives (``Franka``, ``DualFranka``, ``DOSW1``, ``GimArm``,
``Turtle2``), the dataclass each ``hardware.configs`` entry becomes, and the
``HardwareInfo`` dataclass a worker next to the robot receives (its ``config``
is that entry).  The fields and their defaults are RLinf's.

Enumeration builds one info per configured robot of the node, in the driver.
RLinf additionally probes the node itself (pings a Franka, lists its cameras,
looks for a GimArm's CAN interface, fills unset fields from the node's
environment variables); rlinf takes the config as given.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Optional

from ..plugins.descriptors import HardwarePlugin
from ..plugins.hardware import HardwareConfig, HardwareInfo
from ..plugins.hookspecs import hookimpl


def _check_ip(robot: str, label: str, value: Optional[str]) -> None:
    if value is None:
        return
    try:
        ipaddress.ip_address(str(value))
    except ValueError:
        raise ValueError(f"'{label}' in {robot} config must be a valid IP address. But got {value}.") from None


def _str_list(values) -> Optional[list[str]]:
    return None if values is None else [str(v) for v in values]


@dataclass
class FrankaConfig(HardwareConfig):
    """A Franka arm: its IP, cameras, gripper and where its controller runs (RLinf's fields).

    Raises:
        ValueError: ``robot_ip`` is not an IP address.
    """

    robot_ip: Optional[str] = None
    camera_serials: Optional[list[str]] = None
    camera_type: str = "realsense"
    gripper_type: str = "franka"
    gripper_connection: Optional[str] = None
    controller_node_rank: Optional[int] = None
    disable_validate: bool = False

    def __post_init__(self):
        super().__post_init__()
        _check_ip("franka", "robot_ip", self.robot_ip)
        self.camera_serials = _str_list(self.camera_serials)


@dataclass
class FrankaHWInfo(HardwareInfo):
    """A Franka arm on a node; ``config`` is its ``FrankaConfig``.

    Built in the driver, one per ``hardware.configs`` entry of a node group
    whose ``hardware.type`` is ``Franka``; the env worker placed next to the
    device finds it in ``self.worker_info.hardware_infos``.

    Args:
        type: the hardware type, ``"Franka"``.
        model: the model, ``"Franka"`` (as in RLinf).
        config: the device's ``FrankaConfig``, as the cluster config gave it.
    """

    config: FrankaConfig


@dataclass
class DualFrankaConfig(HardwareConfig):
    """Two Franka arms driven by one env worker (RLinf's fields).

    Raises:
        ValueError: ``left_robot_ip`` or ``right_robot_ip`` is not an IP address.
    """

    left_robot_ip: Optional[str] = None
    right_robot_ip: Optional[str] = None
    left_camera_serials: Optional[list[str]] = None
    right_camera_serials: Optional[list[str]] = None
    base_camera_serials: Optional[list[str]] = None
    camera_type: str = "realsense"
    base_camera_type: Optional[str] = None
    left_camera_type: Optional[str] = None
    right_camera_type: Optional[str] = None
    left_gripper_type: str = "franka"
    right_gripper_type: str = "franka"
    left_gripper_connection: Optional[str] = None
    right_gripper_connection: Optional[str] = None
    left_controller_node_rank: Optional[int] = None
    right_controller_node_rank: Optional[int] = None

    def __post_init__(self):
        super().__post_init__()
        _check_ip("DualFranka", "left_robot_ip", self.left_robot_ip)
        _check_ip("DualFranka", "right_robot_ip", self.right_robot_ip)
        for name in ("left_camera_serials", "right_camera_serials", "base_camera_serials"):
            setattr(self, name, _str_list(getattr(self, name)))


@dataclass
class DualFrankaHWInfo(HardwareInfo):
    """A dual-arm Franka system on a node; ``config`` is its ``DualFrankaConfig``.

    Built in the driver, one per ``hardware.configs`` entry of a node group
    whose ``hardware.type`` is ``DualFranka``; the env worker placed next to the
    device finds it in ``self.worker_info.hardware_infos``.

    Args:
        type: the hardware type, ``"DualFranka"``.
        model: the model, ``"DualFranka"`` (as in RLinf).
        config: the device's ``DualFrankaConfig``, as the cluster config gave it.
    """

    config: DualFrankaConfig


@dataclass
class DOSW1HWConfig(HardwareConfig):
    """A DOS-W1 dual-arm robot: its gRPC endpoint, arm ports and cameras (RLinf's fields)."""

    robot_url: str = "localhost"
    left_arm_port: int = 50051
    right_arm_port: int = 50053
    left_lead_port: int = 50050
    right_lead_port: int = 50052
    camera_serials: Optional[list[str]] = None

    def __post_init__(self):
        super().__post_init__()
        self.camera_serials = _str_list(self.camera_serials)


@dataclass
class DOSW1HWInfo(HardwareInfo):
    """A DOS-W1 robot on a node; ``config`` is its ``DOSW1HWConfig``.

    Built in the driver, one per ``hardware.configs`` entry of a node group
    whose ``hardware.type`` is ``DOSW1``; the env worker placed next to the
    device finds it in ``self.worker_info.hardware_infos``.

    Args:
        type: the hardware type, ``"DOSW1"``.
        model: the model, ``"DOSW1"`` (as in RLinf).
        config: the device's ``DOSW1HWConfig``, as the cluster config gave it.
    """

    config: DOSW1HWConfig


@dataclass
class GimArmConfig(HardwareConfig):
    """A GimArm (CAN bus, 6-DOF) arm (RLinf's fields).

    Raises:
        ValueError: ``arm_variant`` is neither ``gim_arm`` nor ``gim_arm_xl``.
    """

    can_interface: str = "can0"
    arm_variant: str = "gim_arm_xl"
    camera_serials: Optional[list[str]] = None
    camera_type: str = "realsense"
    enable_gripper: bool = True
    gripper_type: str = "parallel"
    controller_node_rank: Optional[int] = None
    disable_validate: bool = False

    def __post_init__(self):
        super().__post_init__()
        if self.arm_variant not in ("gim_arm", "gim_arm_xl"):
            raise ValueError(f"'arm_variant' must be 'gim_arm' or 'gim_arm_xl'. But got '{self.arm_variant}'.")
        self.camera_serials = _str_list(self.camera_serials)


@dataclass
class GimArmHWInfo(HardwareInfo):
    """A GimArm on a node (model ``GimArm_<arm_variant>``); ``config`` is its ``GimArmConfig``.

    Built in the driver, one per ``hardware.configs`` entry of a node group
    whose ``hardware.type`` is ``GimArm``; the env worker placed next to the
    device finds it in ``self.worker_info.hardware_infos``.

    Args:
        type: the hardware type, ``"GimArm"``.
        model: ``"GimArm_" + config.arm_variant`` (``"GimArm_gim_arm_xl"``), as in RLinf.
        config: the device's ``GimArmConfig``, as the cluster config gave it.
    """

    config: GimArmConfig


@dataclass
class Turtle2Config(HardwareConfig):
    """An XSquare Turtle2 robot (no fields beyond the node it is attached to)."""


@dataclass
class Turtle2HWInfo(HardwareInfo):
    """A Turtle2 robot on a node; ``config`` is its ``Turtle2Config``.

    Built in the driver, one per ``hardware.configs`` entry of a node group
    whose ``hardware.type`` is ``Turtle2``; the env worker placed next to the
    device finds it in ``self.worker_info.hardware_infos``.

    Args:
        type: the hardware type, ``"Turtle2"``.
        model: the model, ``"Turtle2"`` (as in RLinf).
        config: the device's ``Turtle2Config``, as the cluster config gave it.
    """

    config: Turtle2Config


def _gim_arm_infos(node_rank: int, configs: list) -> list:
    return [GimArmHWInfo(type="GimArm", model=f"GimArm_{c.arm_variant}", config=c) for c in configs]


@hookimpl
def rlinf_register_hardware():
    """RLinf's robot types."""
    return [
        HardwarePlugin(name="Franka", config_class=FrankaConfig, info_class=FrankaHWInfo,
                       description="Franka Emika arm (RLinf real-world envs)"),
        HardwarePlugin(name="DualFranka", config_class=DualFrankaConfig, info_class=DualFrankaHWInfo,
                       description="two Franka arms driven by one env worker"),
        HardwarePlugin(name="DOSW1", config_class=DOSW1HWConfig, info_class=DOSW1HWInfo,
                       description="DOS-W1 dual-arm robot (AirBot gRPC)"),
        HardwarePlugin(name="GimArm", config_class=GimArmConfig, info_class=GimArmHWInfo,
                       enumerate=_gim_arm_infos, description="GimArm 6-DOF arm on a CAN bus"),
        HardwarePlugin(name="Turtle2", config_class=Turtle2Config, info_class=Turtle2HWInfo,
                       description="XSquare Turtle2 robot"),
    ]
