"""Options for one pair of communicating workers."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, fields
from typing import Optional

from .. import config

log = logging.getLogger("rlinf.p2p")

#: RLinf's tuning fields: hints for accelerator transports (NCCL), meaningless to CPU transports
ACCEL_FIELDS = ("accel_max_ctas", "accel_min_ctas", "accel_cluster_size", "is_high_priority_stream", "use_ring_broadcast")


@dataclass
class CollectiveGroupOptions:
    """Transport options for a pair of workers.

    ``transport`` names the transport plugin to use (``None``: the
    ``RLINF_TRANSPORT`` environment variable, else the best usable one for the
    tensors' device).  Both ends of a pair must agree; a mismatch is an error.

    The other fields are RLinf's accelerator tuning knobs.  A transport honours
    the ones it lists in its plugin descriptor's ``extra["options"]``; one that
    cannot honour a field that is set ignores it and says so once at DEBUG level.
    """

    transport: Optional[str] = None
    timeout: Optional[float] = None
    accel_max_ctas: Optional[int] = None
    accel_min_ctas: Optional[int] = None
    accel_cluster_size: Optional[int] = None
    is_high_priority_stream: bool = False
    use_ring_broadcast: bool = False

    def __post_init__(self):
        if self.transport is not None and (not isinstance(self.transport, str) or not self.transport):
            raise ValueError(f"CollectiveGroupOptions.transport must be a non-empty str or None, got {self.transport!r}")
        config.check_timeout(self.timeout, "CollectiveGroupOptions.timeout")
        for name in ("accel_max_ctas", "accel_min_ctas", "accel_cluster_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"CollectiveGroupOptions.{name} must be a positive int or None, got {value!r}")
        for name in ("is_high_priority_stream", "use_ring_broadcast"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"CollectiveGroupOptions.{name} must be a bool, got {getattr(self, name)!r}")
        if self.accel_max_ctas is not None and self.accel_min_ctas is not None and self.accel_min_ctas > self.accel_max_ctas:
            raise ValueError(
                f"CollectiveGroupOptions.accel_min_ctas ({self.accel_min_ctas}) exceeds accel_max_ctas ({self.accel_max_ctas})"
            )

    def transport_options(self) -> dict:
        """The accelerator tuning fields that are set (differ from their defaults)."""
        defaults = {f.name: f.default for f in fields(self)}
        return {n: getattr(self, n) for n in ACCEL_FIELDS if getattr(self, n) != defaults[n]}


_reported: set = set()
_reported_lock = threading.Lock()


def unsupported_options(options: CollectiveGroupOptions, transport_name: str, supported) -> dict:
    """The set fields ``transport_name`` cannot honour; logged once per (transport, field) at DEBUG."""
    ignored = {k: v for k, v in options.transport_options().items() if k not in set(supported or ())}
    with _reported_lock:
        fresh = [k for k in ignored if (transport_name, k) not in _reported]
        _reported.update((transport_name, k) for k in fresh)
    if fresh:
        log.debug("transport %r ignores CollectiveGroupOptions field(s) %s: it does not use them", transport_name, fresh)
    return ignored
