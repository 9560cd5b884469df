"""What a plugin hands to rlinf: small descriptors, cheap to build.

Descriptors are returned by the hooks in ``hookspecs``.  Building one must not
import the backend's heavy dependencies: ``check`` says whether the backend is
usable on this machine and ``factory`` builds it only when it is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional


def _always_usable() -> Optional[str]:
    return None


@dataclass
class LauncherPlugin:
    """A way to start worker processes (Ray, MPI, ...).

    ``factory()`` returns an object implementing ``rlinf.scheduler.plugins.launcher.Launcher``.
    ``check()`` returns ``None`` when usable here, else a one-line reason.
    Among usable launchers the highest ``priority`` is the default.
    """

    name: str
    factory: Callable[[], object]
    priority: int = 0
    check: Callable[[], Optional[str]] = _always_usable
    description: str = ""


@dataclass
class TransportPlugin:
    """A way to move buffers between two workers.

    ``factory()`` returns an object implementing ``rlinf.scheduler.plugins.transport.Transport``.
    ``devices`` names the tensor devices it serves (``"cpu"``, ``"cuda"``); for each
    device the usable transport with the highest ``priority`` is the default.

    ``options`` names the ``CollectiveGroupOptions`` tuning fields the transport
    honours (``"accel_max_ctas"``, ``"is_high_priority_stream"``, ...).  When a
    device link is set up for a call that set some of them, rlinf passes them
    as ``connect(endpoint, hello, deadline, options={field: value})``; a
    transport that declares none is never given the keyword.  A device
    transport asked for a field it does not declare is an error naming both;
    CPU transports ignore the fields (they tune accelerator communication).
    ``check_options(fields)`` returns ``None`` when the transport can take those
    values, else the reason (cheap: no heavy imports; it must never raise).
    """

    name: str
    factory: Callable[[], object]
    priority: int = 0
    devices: tuple[str, ...] = ("cpu",)
    check: Callable[[], Optional[str]] = _always_usable
    description: str = ""
    extra: dict = field(default_factory=dict)
    options: tuple[str, ...] = ()
    check_options: Optional[Callable[[dict], Optional[str]]] = None


def _no_devices() -> int:
    return 0


@dataclass
class AcceleratorPlugin:
    """A kind of accelerator (NVIDIA GPU, AMD GPU, Ascend NPU, ...) and how to use it.

    Device assignment reads it: ``ray_resource`` is the resource name a Ray node
    advertises for it (``ray start --num-gpus`` gives ``"GPU"``; Ascend nodes use
    ``"NPU"``), ``visible_devices_env`` the variable that selects the devices a
    process sees (``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES``,
    ``ASCEND_RT_VISIBLE_DEVICES``), ``torch_device_type`` the ``torch.device``
    type of its tensors (``"cuda"`` for NVIDIA and AMD, ``"npu"`` for Ascend) and
    ``collective_backend`` the ``torch.distributed`` backend for it (``"nccl"``,
    which is RCCL on ROCm builds, ``"hccl"``).

    ``device_count()`` counts this kind's devices visible to the calling process
    and must not initialise the device runtime if it can avoid it (returns 0 when
    the kind's software is missing).  ``check()`` returns ``None`` when this kind
    can be driven from here, else the reason.  When two kinds share a Ray
    resource name (NVIDIA and AMD both advertise ``"GPU"``) the one with local
    devices wins, then the higher ``priority``.
    """

    name: str
    ray_resource: str
    visible_devices_env: str
    torch_device_type: str
    collective_backend: str
    device_count: Callable[[], int] = _no_devices
    priority: int = 0
    check: Callable[[], Optional[str]] = _always_usable
    description: str = ""
    extra: dict = field(default_factory=dict)
