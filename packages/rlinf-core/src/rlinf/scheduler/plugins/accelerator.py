"""Which accelerator kind is in use, and which devices a worker sees.

Accelerator kinds come from plugins (``AcceleratorPlugin`` through the
``rlinf_register_accelerators`` hook); NVIDIA, AMD and Ascend ship with
rlinf-core that way.  This module answers three questions:

* ``for_resources(resources)``: which kind a launcher's node advertises
  (Ray resources such as ``{"GPU": 4}``);
* ``device_env(kind, placement)``: the environment a worker gets: the kind's
  visible-devices variable listing the group's devices on the worker's node,
  the worker's own first device at index ``LOCAL_RANK``;
* ``current()``: the kind active in the calling process (``CPU`` when none),
  for code that needs the torch device type or the collective backend.

The device-visibility rule, and why: the seed's workers call
``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))``, and ``LOCAL_RANK``
counts the group's workers on a node.  So every worker of a group on a node
sees the same list, ordered by local rank (each worker's first device), with
the worker's further devices (``num_hardware_per_process > 1``) appended after
that list.  ``LOCAL_RANK`` then indexes the worker's own device, peers' devices
stay visible (CUDA IPC and NCCL peer access between them work), and
``WorkerInfo.gpu_id`` / ``available_gpus`` are indices into the same list.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

from ..base.errors import PluginError
from . import AcceleratorPlugin

#: driver setting: force an accelerator kind by name when several could match
ACCELERATOR_ENV = "RLINF_ACCELERATOR"
#: set by core in each worker: the kind this worker was given ("cpu" when none)
WORKER_ACCELERATOR_ENV = "RLINF_WORKER_ACCELERATOR"

CPU = AcceleratorPlugin(
    name="cpu",
    accelerator_type="NO_ACCEL",
    ray_resource="",
    visible_devices_env="",
    torch_device_type="cpu",
    collective_backend="gloo",
    description="no accelerator",
)


def kinds() -> list[AcceleratorPlugin]:
    """Usable accelerator kinds, highest priority first."""
    from . import get_registry

    entries = [p for p in get_registry().provided["accelerator"].values() if not p.unusable_reason()]
    return [p.descriptor for p in sorted(entries, key=lambda p: -p.descriptor.priority)]


def get(name: str) -> AcceleratorPlugin:
    """The kind named ``name`` (``"cpu"`` included); PluginError naming the installed ones otherwise."""
    if name == CPU.name:
        return CPU
    from . import get_registry

    entry = get_registry().provided["accelerator"].get(name)
    if entry is None:
        raise PluginError(f"no accelerator named {name!r}; installed: {sorted(get_registry().provided['accelerator'])}")
    reason = entry.unusable_reason()
    if reason:
        raise PluginError(f"accelerator {name!r} from {entry.source.distribution} is not usable here: {reason}")
    return entry.descriptor


def _forced() -> Optional[AcceleratorPlugin]:
    name = os.environ.get(ACCELERATOR_ENV)
    return get(name) if name else None


def _local_count(kind: AcceleratorPlugin) -> int:
    try:
        return int(kind.device_count())
    except Exception:
        return 0


def detect_local() -> Optional[AcceleratorPlugin]:
    """The kind with devices visible to this process (or the forced one); None when there is none."""
    forced = _forced()
    if forced is not None:
        return forced
    for kind in kinds():
        if _local_count(kind) > 0:
            return kind
    return None


def for_resources(resources: Mapping[str, float]) -> Optional[AcceleratorPlugin]:
    """The kind a node advertising ``resources`` (Ray style) has; None for a node without any.

    Kinds sharing a resource name (NVIDIA and AMD: ``"GPU"``) are told apart
    by which one has devices here, then by priority; ``RLINF_ACCELERATOR``
    settles it explicitly.
    """
    forced = _forced()
    if forced is not None:
        return forced if forced.ray_resource and resources.get(forced.ray_resource, 0) > 0 else None
    candidates = [k for k in kinds() if resources.get(k.ray_resource, 0) > 0]
    if not candidates:
        return None
    local = [k for k in candidates if _local_count(k) > 0]
    return (local or candidates)[0]


def resource_name(resources: Mapping[str, float]) -> str:
    """The Ray resource to count and reserve for accelerators on a node (``"GPU"`` when none is advertised)."""
    kind = for_resources(resources)
    return kind.ray_resource if kind is not None else "GPU"


def for_node(name: str) -> AcceleratorPlugin:
    """The kind a launcher recorded for a node (``NodeInfo.accelerator``), or the best guess here."""
    if name:
        return get(name)
    found = detect_local()
    if found is not None:
        return found
    available = kinds()
    if not available:
        raise PluginError("the placement gives this worker accelerators, but no accelerator plugin is installed")
    return available[0]


def device_env(kind: AcceleratorPlugin, visible: tuple, inherited: Optional[str]) -> dict:
    """The environment giving a worker the node-local devices ``visible`` (its own first at LOCAL_RANK).

    ``inherited`` is the process's own value of the kind's variable before
    rlinf touched it: when the launcher started the process restricted to a
    list (``CUDA_VISIBLE_DEVICES=2,3`` for the whole MPI job), the node-local
    indices are indices into that list.
    """
    if not visible:
        return {WORKER_ACCELERATOR_ENV: CPU.name}
    ids = [str(i) for i in visible]
    if inherited:
        base = [d.strip() for d in inherited.split(",") if d.strip()]
        if base and max(visible) < len(base):
            ids = [base[i] for i in visible]
    return {kind.visible_devices_env: ",".join(ids), WORKER_ACCELERATOR_ENV: kind.name}


def current() -> AcceleratorPlugin:
    """The accelerator kind active in this process; ``CPU`` when none.

    In a worker this is the kind its placement gave it (``CPU`` for a worker
    without devices, even on a GPU node); elsewhere the kind with devices
    visible here.  ``torch_device_type`` and ``collective_backend`` of the
    result are what device code should use.
    """
    name = os.environ.get(WORKER_ACCELERATOR_ENV)
    if name:
        return get(name)
    return detect_local() or CPU


# -- RLinf's names for the same answers (``Worker.accelerator_type`` and friends) ---------------
#: RLinf's ``AcceleratorType`` value of "no accelerator"
NO_ACCEL = "NO_ACCEL"


def detect() -> tuple[str, Optional[str]]:
    """``(accelerator_type, torch_device_type)`` of this process, as RLinf gives them: ``("NV_GPU", "cuda")``,
    or ``("NO_ACCEL", None)`` without an accelerator (RLinf programs test ``torch_platform is not None``).
    A kind's RLinf type is its descriptor's ``accelerator_type`` (the name upper-cased when unset)."""
    kind = current()
    if kind is CPU:
        return NO_ACCEL, None
    return kind.rlinf_type, kind.torch_device_type


def by_rlinf_type(accelerator_type: str) -> Optional[AcceleratorPlugin]:
    """The usable kind whose RLinf ``AcceleratorType`` value is ``accelerator_type`` (``CPU`` for NO_ACCEL);
    None when no installed kind has it.  Several kinds of one type: the one with devices here, else the
    highest priority."""
    value = getattr(accelerator_type, "value", accelerator_type)
    if value == NO_ACCEL:
        return CPU
    matches = [k for k in kinds() if k.rlinf_type == value]
    if not matches:
        return None
    local = [k for k in matches if _local_count(k) > 0]
    return (local or matches)[0]


def torch_platform():
    """The torch module of the accelerator (``torch.cuda``); ``None`` without one, as in RLinf."""
    device_type = detect()[1]
    if device_type is None:
        return None
    import torch

    return getattr(torch, device_type)


class lazy_class_attribute:
    """A class attribute computed on access (from the class or an instance): valid in the driver and in
    every worker, whose accelerator is known only once its placement set the environment."""

    def __init__(self, fn):
        self._fn = fn
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner, name):
        self._name = name

    def __get__(self, obj, cls=None):
        return self._fn()
