"""RLinf's NCCL tuning fields (``CollectiveGroupOptions``) and what each transport makes of them.

Core hands a device transport the fields its plugin descriptor declares
(``TransportPlugin.options``) when a pair's link is set up; the dialer
carries them to the other end in its offer, so both ranks of the pair's
communicator are configured alike.  Cheap to import: the plugin module
declares these at discovery, before torch is imported.

* ``torch-nccl``: ``accel_max_ctas`` / ``accel_min_ctas`` /
  ``accel_cluster_size`` become the communicator's ``ncclConfig_t``
  (``ProcessGroupNCCL.Options().config``: ``max_ctas``, ``min_ctas``,
  ``cga_cluster_size``), ``is_high_priority_stream`` the option of that name
  (NCCL's internal streams get the highest priority).
* ``cupy-nccl``: CuPy creates communicators without a config, so only
  ``is_high_priority_stream`` (the transport's own stream) is honoured.
"""

from __future__ import annotations

from typing import Optional

#: what torch-nccl honours, and where each field goes in ``ProcessGroupNCCL.Options``
TORCH_NCCL = {
    "accel_max_ctas": "config.max_ctas",
    "accel_min_ctas": "config.min_ctas",
    "accel_cluster_size": "config.cga_cluster_size",
    "is_high_priority_stream": "is_high_priority_stream",
}
#: what cupy-nccl honours
CUPY_NCCL = ("is_high_priority_stream",)
#: NCCL's limits (as RLinf and Megatron-LM check them): CTAs per collective, CGA cluster size
MAX_CTAS = 32
MAX_CLUSTER_SIZE = 8


def check(fields: dict) -> Optional[str]:
    """Why NCCL cannot take these values, or None.  Also run on the accepting side, on the dialer's offer."""
    for name in ("accel_max_ctas", "accel_min_ctas"):
        value = fields.get(name)
        if value is not None and not (isinstance(value, int) and 1 <= value <= MAX_CTAS):
            return f"{name} must be between 1 and {MAX_CTAS}, got {value!r}"
    size = fields.get("accel_cluster_size")
    if size is not None and not (isinstance(size, int) and 1 <= size <= MAX_CLUSTER_SIZE):
        return f"accel_cluster_size must be between 1 and {MAX_CLUSTER_SIZE}, got {size!r}"
    low, high = fields.get("accel_min_ctas"), fields.get("accel_max_ctas")
    if low is not None and high is not None and low > high:
        return f"accel_min_ctas ({low}) exceeds accel_max_ctas ({high})"
    flag = fields.get("is_high_priority_stream")
    if flag is not None and not isinstance(flag, bool):
        return f"is_high_priority_stream must be a bool, got {flag!r}"
    return None


def unknown(fields: dict, honoured) -> list:
    """Fields of an offer that this transport does not honour (a peer with another rlinf-nccl)."""
    return sorted(set(fields) - set(honoured))


def torch_nccl_settings(fields: dict) -> dict:
    """``{"config.max_ctas": 4, ...}``: the ``ProcessGroupNCCL.Options`` attributes to set for ``fields``."""
    return {TORCH_NCCL[name]: value for name, value in fields.items() if name in TORCH_NCCL}


def apply(options, settings: dict):
    """Set ``settings`` (from ``torch_nccl_settings``) on a ``ProcessGroupNCCL.Options``; returns it."""
    for path, value in settings.items():
        target = options
        *parents, leaf = path.split(".")
        for part in parents:
            target = getattr(target, part)
        setattr(target, leaf, value)
    return options
