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

    Args:
        name: the launcher's name (``Cluster(launcher=name)``, ``RLINF_LAUNCHER``).
        factory: builds the launcher; called only when it is chosen.
        priority: higher wins when no launcher is named.
        check: says whether the launcher is usable here; must be cheap and never raise.
        description: one line for ``python -m rlinf.scheduler plugins``.

    Example:
        ```python
        @hookimpl
        def rlinf_register_launchers():
            return [LauncherPlugin(name="slurm", factory=lambda: SlurmLauncher(), priority=5,
                                   check=lambda: None if shutil.which("srun") else "srun not found")]
        ```
    """

    name: str
    factory: Callable[[], object]
    priority: int = 0
    check: Callable[[], Optional[str]] = _always_usable
    """Returns None when the launcher is usable on this machine, else a one-line reason (default: usable)."""
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

    Args:
        name: the transport's name (``RLINF_TRANSPORT``, ``get_registry().transport(name)``).
        factory: builds the transport; called only when it is chosen.
        priority: higher wins, per device, when no transport is named.
        devices: the tensor devices it serves.
        check: says whether the transport is usable here; must be cheap and never raise.
        description: one line for ``python -m rlinf.scheduler plugins``.
        extra: free-form settings for the transport's own use.
        options: the ``CollectiveGroupOptions`` fields it honours.
        check_options: validates values of those fields (None: any value is taken).
    """

    name: str
    factory: Callable[[], object]
    priority: int = 0
    devices: tuple[str, ...] = ("cpu",)
    check: Callable[[], Optional[str]] = _always_usable
    """Returns None when the transport is usable on this machine, else a one-line reason (default: usable)."""
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

    Args:
        name: the kind's name (``"nvidia"``, ``"amd"``, ``"ascend"``).
        ray_resource: the Ray resource name of its devices.
        visible_devices_env: the variable that selects a process's devices.
        torch_device_type: the ``torch.device`` type of its tensors.
        collective_backend: its ``torch.distributed`` backend.
        device_count: counts its devices visible here (default: none).
        priority: breaks ties between kinds sharing a Ray resource name.
        check: says whether the kind can be driven here; must never raise.
        description: one line for ``python -m rlinf.scheduler plugins``.
        extra: further settings (``socket_ifname_env``: the variable naming the collectives' interface).
        accelerator_type: RLinf's ``AcceleratorType`` value of the kind (empty: ``name`` upper-cased).
    """

    name: str
    ray_resource: str
    visible_devices_env: str
    torch_device_type: str
    collective_backend: str
    device_count: Callable[[], int] = _no_devices
    """Counts this kind's devices visible to the calling process (default: 0); cheap, never raises."""
    priority: int = 0
    check: Callable[[], Optional[str]] = _always_usable
    """Returns None when this kind can be driven from here, else the reason (default: usable)."""
    description: str = ""
    extra: dict = field(default_factory=dict)
    #: RLinf's ``AcceleratorType`` value of this kind (``"NV_GPU"``, ``"AMD_GPU"``, ``"NPU"``, ...);
    #: empty: the name upper-cased
    accelerator_type: str = ""

    @property
    def rlinf_type(self) -> str:
        """RLinf's ``AcceleratorType`` value for this kind (``accelerator_type``, else ``name.upper()``)."""
        return self.accelerator_type or self.name.upper()


def _one_info_per_config(plugin: "HardwarePlugin", node_rank: int, configs: list) -> list:
    return [plugin.info_class(type=plugin.name, model=plugin.name, config=c) for c in configs]


@dataclass
class HardwarePlugin:
    """A kind of hardware attached to nodes (a robot arm, a camera rig, ...), named in the cluster config.

    A node group of RLinf's ``cluster`` section names it in ``hardware.type``
    and lists one entry per device in ``hardware.configs``; each entry becomes
    a ``config_class`` instance (a dataclass whose first field is
    ``node_rank``; unknown or missing fields are refused naming the group).

    ``enumerate(node_rank, configs)`` returns the ``HardwareInfo`` objects of
    the node ``node_rank`` given this kind's configs for that node (possibly
    none); ``None`` builds one ``info_class(type=name, model=name, config=c)``
    per config.  It runs in the driver when a ``Cluster`` is made with the
    config and may raise to refuse a config (the error names the node).
    ``check()`` returns ``None`` when this kind can be used here, else the
    reason; it never raises.
    """

    name: str
    config_class: type
    info_class: type
    enumerate: Optional[Callable[[int, list], Optional[list]]] = None
    priority: int = 0
    check: Callable[[], Optional[str]] = _always_usable
    description: str = ""
    extra: dict = field(default_factory=dict)

    def enumerate_node(self, node_rank: int, configs: list) -> list:
        """The hardware infos of node ``node_rank`` (``enumerate`` or one info per config); ``[]`` when none."""
        if self.enumerate is None:
            return _one_info_per_config(self, node_rank, configs)
        return list(self.enumerate(node_rank, configs) or [])
