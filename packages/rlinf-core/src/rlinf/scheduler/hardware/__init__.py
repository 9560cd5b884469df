"""``rlinf.scheduler.hardware``: RLinf's hardware API; every kind comes from a plugin.

* Accelerators: ``AcceleratorType`` and ``AcceleratorUtil`` answer from the
  accelerator plugins (hook ``rlinf_register_accelerators``).
* Other hardware (robots, ...): ``HardwarePlugin`` descriptors (hook
  ``rlinf_register_hardware``) name a type the cluster config's
  ``node_groups[].hardware`` uses, its config dataclass (a ``HardwareConfig``)
  and its info dataclass (a ``HardwareInfo``).  RLinf's robots ship with
  rlinf-core that way (``rlinf.scheduler.hardware.robots``): ``FrankaHWInfo``,
  ``DualFrankaHWInfo``, ``DOSW1HWInfo``, ``GimArmHWInfo``, ``Turtle2HWInfo`` and
  their configs.

Layer: the public API; it may import ``plugins`` and ``base`` only.
"""

from ..plugins.accelerator_types import AcceleratorType, AcceleratorUtil
from ..plugins.cluster_config import NodeHardwareConfig
from ..plugins.descriptors import HardwarePlugin
from ..plugins.hardware import ACCELERATOR_HW_TYPE, HardwareConfig, HardwareInfo, HardwareResource
from ..plugins.hookspecs import hookimpl
from .robots import (
    DOSW1HWConfig,
    DOSW1HWInfo,
    DualFrankaConfig,
    DualFrankaHWInfo,
    FrankaConfig,
    FrankaHWInfo,
    GimArmConfig,
    GimArmHWInfo,
    Turtle2Config,
    Turtle2HWInfo,
)

__all__ = [
    "ACCELERATOR_HW_TYPE",
    "AcceleratorType",
    "AcceleratorUtil",
    "HardwareConfig",
    "HardwareInfo",
    "HardwarePlugin",
    "HardwareResource",
    "NodeHardwareConfig",
    "hookimpl",
    "DOSW1HWConfig",
    "DOSW1HWInfo",
    "DualFrankaConfig",
    "DualFrankaHWInfo",
    "FrankaConfig",
    "FrankaHWInfo",
    "GimArmConfig",
    "GimArmHWInfo",
    "Turtle2Config",
    "Turtle2HWInfo",
]
