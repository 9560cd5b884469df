"""Which accelerator this process drives, as ``Worker.torch_platform`` and friends report it.

One small function decides (CUDA when ``torch.cuda.is_available()``, else CPU)
so that accelerator plugins can later take over the decision in one place.
Detection is lazy: importing ``rlinf.scheduler`` never imports torch.
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def detect() -> tuple[str, str]:
    """``(accelerator_type, torch_device_type)`` of this process: ``("NV_GPU", "cuda")`` or ``("NO_ACCEL", "cpu")``."""
    try:
        import torch
    except ImportError:
        return "NO_ACCEL", "cpu"
    if torch.cuda.is_available():
        return "NV_GPU", "cuda"
    return "NO_ACCEL", "cpu"


def torch_platform():
    """The torch module of the accelerator (``torch.cuda``), ``torch.cpu`` without one."""
    import torch

    return getattr(torch, detect()[1])


class lazy_class_attribute:
    """A class attribute computed on first access (from the class or an instance), then cached."""

    def __init__(self, fn):
        self._fn = fn
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner, name):
        self._name = name

    def __get__(self, obj, cls=None):
        return self._fn()
