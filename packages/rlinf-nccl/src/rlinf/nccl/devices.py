"""Which GPU this process uses, and whether two ends share one (NCCL refuses that)."""

from __future__ import annotations

from typing import Optional


def device_identity() -> Optional[str]:
    """The UUID of this process's current CUDA device, or None without CUDA."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
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
