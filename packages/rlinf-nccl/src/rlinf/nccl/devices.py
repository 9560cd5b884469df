"""Which GPU this process uses, and whether two ends share one (NCCL refuses that)."""

from __future__ import annotations

from typing import Optional


def device_identity(index: Optional[int] = None) -> Optional[str]:
    """The UUID of CUDA device ``index`` (default: ``default_index()``), or None without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(default_index() if index is None else index)
        return str(getattr(props, "uuid", "")) or f"{props.name}:{props.pci_bus_id if hasattr(props, 'pci_bus_id') else ''}"
    except Exception:
        return None


def same_device_reason(theirs: Optional[str], mine: Optional[str]) -> Optional[str]:
    """The error for a pair of processes on one GPU, or None when they use different ones."""
    if theirs and mine and theirs == mine:
        return (
            f"both ends of this pair use GPU {mine}; NCCL cannot connect two processes on one GPU. "
            "Place the two workers on different GPUs, or send between them with the CUDA IPC path "
            "(transport 'cuda-ipc') or the CPU transport (CollectiveGroupOptions(transport='cpu'))"
        )
    return None


def default_index() -> int:
    """The CUDA device a device transport uses in this process.

    In an rlinf worker given accelerators: its own device, ``LOCAL_RANK`` (the
    index the seed passes to ``torch.cuda.set_device``), whatever thread asks;
    elsewhere the calling thread's current device.  (CUDA's current device is
    per thread, and transports accept connections on threads of their own.)
    """
    import os

    import torch

    if os.environ.get("RLINF_WORKER_ACCELERATOR") not in (None, "", "cpu") and os.environ.get("LOCAL_RANK"):
        return int(os.environ["LOCAL_RANK"])
    return torch.cuda.current_device()
