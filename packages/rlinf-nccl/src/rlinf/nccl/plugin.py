"""Registers the rlinf-nccl transports through the same hook every backend uses.

Checks are cheap: they look for the modules and devices without initialising
CUDA or NCCL.
"""

from __future__ import annotations

import importlib.util
from typing import Optional

from rlinf.scheduler.plugins import TransportPlugin, hookimpl

from . import tuning


def _torch_distributed() -> Optional[str]:
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    import torch.distributed as dist

    if not dist.is_available():
        return "this torch build has no torch.distributed"
    return None


def _gloo() -> Optional[str]:
    """Cheap where torch is not imported yet: every worker checks CPU transports as it starts, and
    importing torch there would add seconds to every launch.  A build without gloo then fails at the
    first pair setup, with torch's own error."""
    import sys

    if "torch" not in sys.modules:
        return None if importlib.util.find_spec("torch") is not None else "torch is not installed"
    reason = _torch_distributed()
    if reason:
        return reason
    import torch.distributed as dist

    return None if dist.is_gloo_available() else "this torch build has no gloo backend"


def _cuda() -> Optional[str]:
    import torch

    if not torch.cuda.is_available():
        built = getattr(torch.version, "cuda", None)
        return "no CUDA device is visible here" if built else f"torch {torch.__version__} is built without CUDA"
    return None


def _nccl() -> Optional[str]:
    reason = _torch_distributed() or _cuda()
    if reason:
        return reason
    import torch.distributed as dist

    return None if dist.is_nccl_available() else "this torch build has no NCCL backend"


def _cupy() -> Optional[str]:
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'rlinf-nccl[cupy12]' or '[cupy13]')"
    reason = _torch_distributed() or _cuda()
    if reason:
        return reason
    try:
        from cupy.cuda import nccl  # noqa: F401
    except Exception as exc:
        return f"CuPy has no NCCL here: {type(exc).__name__}: {exc}"
    return None


def _gloo_factory():
    from .torch_pair import GlooTransport

    return GlooTransport()


def _nccl_factory():
    from .torch_pair import NcclTransport

    return NcclTransport()


def _cupy_factory():
    from .cupy_pair import CupyNcclTransport

    return CupyNcclTransport()


@hookimpl
def rlinf_register_transports():
    return [
        TransportPlugin(
            name="torch-gloo",
            factory=_gloo_factory,
            priority=1,  # an option, never the default: the built-in cpu transport is faster on one host
            devices=("cpu",),
            check=_gloo,
            description="torch gloo process group per pair (rendezvous over the cpu transport)",
        ),
        TransportPlugin(
            name="torch-nccl",
            factory=_nccl_factory,
            priority=20,
            devices=("cuda",),
            check=_nccl,
            description="torch NCCL process group per pair; CUDA tensors without host staging",
            options=tuple(tuning.TORCH_NCCL),  # the communicator's ncclConfig_t and stream priority
            check_options=tuning.check,
        ),
        TransportPlugin(
            name="cupy-nccl",
            factory=_cupy_factory,
            priority=10,
            devices=("cuda",),
            check=_cupy,
            description="CuPy NCCL communicator per pair over the tensors' own memory",
            options=tuning.CUPY_NCCL,  # CuPy takes no communicator config: only its stream's priority
            check_options=tuning.check,
        ),
    ]
