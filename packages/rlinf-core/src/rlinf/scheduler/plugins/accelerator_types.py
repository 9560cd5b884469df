"""RLinf's ``AcceleratorType`` and ``AcceleratorUtil``, answered by the accelerator plugins.

``AcceleratorType`` names the kinds RLinf knows; a plugin's descriptor says
which one it is (``AcceleratorPlugin.accelerator_type``; ``nvidia`` is
``NV_GPU``, ``amd`` ``AMD_GPU``, ``ascend`` ``NPU``).  ``AcceleratorUtil``'s
static helpers take such a type and ask the installed kind of that type
(``torch_device_type``, ``collective_backend``, ``visible_devices_env``), so an
accelerator added by a third-party plugin answers them too (its type is then
its ``accelerator_type`` string, or its name upper-cased).  ``NO_ACCEL``
answers as RLinf does: no platform, no device type, no collective backend.
"""

from __future__ import annotations

import contextlib
import os
from enum import Enum
from typing import Any, Optional

from . import accelerator as _accel
from .descriptors import AcceleratorPlugin


class AcceleratorType(str, Enum):
    """The accelerator kinds RLinf names (a ``str``: ``AcceleratorType.NV_GPU == "NV_GPU"``)."""

    NV_GPU = "NV_GPU"
    AMD_GPU = "AMD_GPU"
    INTEL_GPU = "INTEL_GPU"
    NPU = "NPU"  # Huawei Ascend
    NO_ACCEL = "NO_ACCEL"
    MUSA_GPU = "MUSA_GPU"


def _as_type(value: Any):
    """``value`` as an ``AcceleratorType`` member when it names one, else the string itself."""
    text = getattr(value, "value", value)
    try:
        return AcceleratorType(text)
    except ValueError:
        return str(text)


def _kind(accelerator_type: Any) -> AcceleratorPlugin:
    kind = _accel.by_rlinf_type(accelerator_type)
    if kind is None:
        installed = sorted({k.rlinf_type for k in _accel.kinds()} | {AcceleratorType.NO_ACCEL.value})
        raise ValueError(
            f"Unsupported accelerator type: {getattr(accelerator_type, 'value', accelerator_type)!r}; "
            f"installed accelerator plugins provide {installed}"
        )
    return kind


def _is_none(accelerator_type: Any) -> bool:
    return getattr(accelerator_type, "value", accelerator_type) == AcceleratorType.NO_ACCEL.value


class AcceleratorUtil:
    """RLinf's static accelerator helpers; each takes an ``AcceleratorType`` (or its string value).

    A type no installed accelerator plugin provides raises ``ValueError`` naming
    the installed ones, as RLinf's "Unsupported accelerator type".

    Example:
        ```python
        accel = AcceleratorUtil.get_accelerator_type()  # AcceleratorType.NV_GPU on an NVIDIA node
        env = AcceleratorUtil.get_accelerator_env_var(accel, [0, 1])  # {"CUDA_VISIBLE_DEVICES": "0,1"}
        backend = AcceleratorUtil.get_ccl_backend(accel)  # "nccl"
        ```
    """

    #: types whose collectives RLinf drives itself (rlinf's device transports serve the same kinds)
    CCL_SUPPORT_LIST = [AcceleratorType.NV_GPU, AcceleratorType.AMD_GPU, AcceleratorType.MUSA_GPU]

    @staticmethod
    def get_accelerator_type():
        """The type of the accelerator active in this process (``NO_ACCEL`` without one), even outside a worker."""
        return _as_type(_accel.detect()[0])

    @staticmethod
    def get_accelerator_env_var(accelerator_type, visible_accelerators: list) -> dict[str, str]:
        """The environment that makes ``visible_accelerators`` (device ids) the visible ones.

        Args:
            accelerator_type (AcceleratorType | str): an ``AcceleratorType`` or its string value.
            visible_accelerators: the node-local device ids a process is to see, in order.

        Returns:
            ``{<the kind's visible-devices variable>: "0,1,..."}``; ``{}`` for NO_ACCEL.

        Raises:
            ValueError: no installed accelerator plugin provides ``accelerator_type``.
        """
        if _is_none(accelerator_type):
            return {}
        kind = _kind(accelerator_type)
        return {kind.visible_devices_env: ",".join(str(v) for v in visible_accelerators)}

    @staticmethod
    def get_visible_devices(accelerator_type) -> list[int]:
        """The device ids this process's visible-devices variable lists (``[]`` when unset or NO_ACCEL).

        Args:
            accelerator_type (AcceleratorType | str): an ``AcceleratorType`` or its string value; its plugin names the variable.

        Raises:
            ValueError: the variable holds something other than comma-separated integers, or no installed
                accelerator plugin provides ``accelerator_type``.
        """
        if _is_none(accelerator_type):
            return []
        raw = os.environ.get(_kind(accelerator_type).visible_devices_env, "")
        if not raw.strip():
            return []
        try:
            return [int(v.strip()) for v in raw.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"Invalid visible device IDs: {raw!r}; expected integers separated by commas") from None

    @staticmethod
    def get_ccl_backend(accelerator_type) -> Optional[str]:
        """The ``torch.distributed`` backend of the type's collectives.

        Args:
            accelerator_type (AcceleratorType | str): an ``AcceleratorType`` or its string value.

        Returns:
            The plugin's ``collective_backend`` (``"nccl"``, ``"hccl"``); None for NO_ACCEL.

        Raises:
            ValueError: no installed accelerator plugin provides ``accelerator_type``.
        """
        if _is_none(accelerator_type):
            return None
        return _kind(accelerator_type).collective_backend

    @staticmethod
    def get_ccl_socket_ifname_env_var(accelerator_type) -> str:
        """The variable naming the network interface of the type's collectives (``NCCL_SOCKET_IFNAME``, ...).

        ``GLOO_SOCKET_IFNAME`` for NO_ACCEL; a plugin may set ``extra["socket_ifname_env"]``, else it is
        ``<BACKEND>_SOCKET_IFNAME``.

        Args:
            accelerator_type (AcceleratorType | str): an ``AcceleratorType`` or its string value.

        Raises:
            ValueError: no installed accelerator plugin provides ``accelerator_type``.
        """
        if _is_none(accelerator_type):
            return "GLOO_SOCKET_IFNAME"
        kind = _kind(accelerator_type)
        return kind.extra.get("socket_ifname_env") or f"{kind.collective_backend.upper()}_SOCKET_IFNAME"

    @staticmethod
    def get_torch_platform(accelerator_type):
        """The torch module of the type (``torch.cuda``, ``torch.npu``); None for NO_ACCEL.

        Imports torch (only for a type other than NO_ACCEL).

        Args:
            accelerator_type (AcceleratorType | str): an ``AcceleratorType`` or its string value.

        Raises:
            ValueError: torch (or its extension for the type) does not provide that module, or no installed
                accelerator plugin provides ``accelerator_type``.
        """
        device_type = AcceleratorUtil.get_device_type(accelerator_type)
        if device_type is None:
            return None
        import torch

        platform = getattr(torch, device_type, None)
        if platform is None:
            raise ValueError(f"torch has no module torch.{device_type} for accelerator type {accelerator_type!r}")
        return platform

    @staticmethod
    def get_device_type(accelerator_type) -> Optional[str]:
        """The ``torch.device`` type of the type's tensors.

        Args:
            accelerator_type (AcceleratorType | str): an ``AcceleratorType`` or its string value.

        Returns:
            The plugin's ``torch_device_type`` (``"cuda"`` for NVIDIA and AMD, ``"npu"``); None for NO_ACCEL.

        Raises:
            ValueError: no installed accelerator plugin provides ``accelerator_type``.
        """
        if _is_none(accelerator_type):
            return None
        return _kind(accelerator_type).torch_device_type

    @staticmethod
    def get_accel_pg_options(accelerator_type, options):
        """NCCL process-group options from a ``CollectiveGroupOptions``, with RLinf's defaults.

        The fields ``options`` leaves unset take RLinf's values (CGA cluster size 4, at most 32 and at least 1
        CTA, normal-priority stream).  Imports ``torch.distributed`` when it builds options.

        Returns a ``ProcessGroupNCCL.Options``, or None when ``options`` sets nothing, for NO_ACCEL and for
        backends other than NCCL.

        Args:
            accelerator_type (AcceleratorType | str): an ``AcceleratorType`` or its string value.
            options (CollectiveGroupOptions | None): a ``CollectiveGroupOptions`` (or any object with its
                ``accel_*`` and ``is_high_priority_stream`` fields), or None.

        Raises:
            ValueError: no installed accelerator plugin provides ``accelerator_type``.
        """
        if _is_none(accelerator_type) or options is None:
            return None
        fields = ("accel_cluster_size", "accel_max_ctas", "accel_min_ctas", "is_high_priority_stream")
        if all(getattr(options, f, None) in (None, False) for f in fields):
            return None
        if _kind(accelerator_type).collective_backend != "nccl":
            return None
        from torch.distributed import ProcessGroupNCCL

        pg_options = ProcessGroupNCCL.Options()
        pg_options.config.cga_cluster_size = getattr(options, "accel_cluster_size", None) or 4
        pg_options.config.max_ctas = getattr(options, "accel_max_ctas", None) or 32
        pg_options.config.min_ctas = getattr(options, "accel_min_ctas", None) or 1
        pg_options.is_high_priority_stream = bool(getattr(options, "is_high_priority_stream", False))
        return pg_options

    @staticmethod
    def start_profiling(accelerator_type, step_idx: Optional[int] = None) -> None:
        """Open RLinf's step-gated profiler capture window; rlinf drives no profiler, so this does nothing.

        Args:
            accelerator_type (AcceleratorType | str): an ``AcceleratorType`` or its string value (not checked).
            step_idx: the training step the window is for (RLinf gates capture on it); ignored.
        """

    @staticmethod
    def stop_profiling(accelerator_type) -> None:
        """Close RLinf's profiler capture window; does nothing here (see ``start_profiling``).

        Args:
            accelerator_type (AcceleratorType | str): an ``AcceleratorType`` or its string value (not checked).
        """

    @staticmethod
    def profiling_range(accelerator_type, label: str, color: Optional[str] = None, domain: Optional[str] = None):
        """A context manager annotating a code range for a profiler (NVTX in RLinf); a no-op here.

        Returns ``contextlib.nullcontext()``: ``with AcceleratorUtil.profiling_range(t, "step"):`` just runs
        the block.

        Args:
            accelerator_type (AcceleratorType | str): an ``AcceleratorType`` or its string value (not checked).
            label: the range's name as a profiler would show it.
            color: the range's colour in the profiler's timeline; ignored.
            domain: the profiler domain to record the range in; ignored.
        """
        return contextlib.nullcontext()
