"""Registers the accelerator kinds that ship with rlinf, exactly as a third-party plugin would.

Counting devices never imports torch or initialises a device runtime: the
visible-devices variable is read when set, else the device nodes in ``/dev``
are counted.
"""

from __future__ import annotations

import glob
import os

from . import AcceleratorPlugin, hookimpl


def _listed(var: str):
    raw = os.environ.get(var)
    if raw is None:
        return None
    return len([d for d in raw.split(",") if d.strip() and d.strip() != "-1"])


def _count(var: str, pattern: str, require: str = "") -> int:
    listed = _listed(var)
    if listed is not None:
        return listed
    if require and not os.path.exists(require):
        return 0
    return len(glob.glob(pattern))


def _nvidia() -> int:
    return _count("CUDA_VISIBLE_DEVICES", "/dev/nvidia[0-9]*")


def _amd() -> int:
    return _count("HIP_VISIBLE_DEVICES", "/dev/dri/renderD*", require="/dev/kfd")


def _ascend() -> int:
    return _count("ASCEND_RT_VISIBLE_DEVICES", "/dev/davinci[0-9]*")


@hookimpl
def rlinf_register_accelerators():
    return [
        AcceleratorPlugin(
            name="nvidia",
            accelerator_type="NV_GPU",
            ray_resource="GPU",
            visible_devices_env="CUDA_VISIBLE_DEVICES",
            torch_device_type="cuda",
            collective_backend="nccl",
            device_count=_nvidia,
            priority=20,
            description="NVIDIA GPUs (CUDA); collectives through NCCL",
        ),
        AcceleratorPlugin(
            name="amd",
            accelerator_type="AMD_GPU",
            ray_resource="GPU",
            visible_devices_env="HIP_VISIBLE_DEVICES",
            torch_device_type="cuda",  # ROCm builds of torch use the cuda device type
            collective_backend="nccl",  # RCCL behind torch's nccl backend
            device_count=_amd,
            priority=10,
            description="AMD GPUs (ROCm); collectives through RCCL (torch backend 'nccl')",
        ),
        AcceleratorPlugin(
            name="ascend",
            accelerator_type="NPU",
            ray_resource="NPU",
            visible_devices_env="ASCEND_RT_VISIBLE_DEVICES",
            torch_device_type="npu",
            collective_backend="hccl",
            device_count=_ascend,
            priority=10,
            description="Huawei Ascend NPUs (torch_npu); collectives through HCCL",
        ),
    ]
