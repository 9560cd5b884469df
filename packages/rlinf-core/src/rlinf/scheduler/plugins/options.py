"""Options for one pair of communicating workers."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, fields
from typing import Optional

from ..base import config

log = logging.getLogger("rlinf.p2p")

#: RLinf's tuning fields: hints for accelerator transports (NCCL), meaningless to CPU transports
ACCEL_FIELDS = ("accel_max_ctas", "accel_min_ctas", "accel_cluster_size", "is_high_priority_stream", "use_ring_broadcast")
#: the fields a device transport may honour when it sets up a pair (``use_ring_broadcast`` is broadcast's hint)
LINK_FIELDS = ACCEL_FIELDS[:4]


@dataclass
class CollectiveGroupOptions:
    """Transport options for a pair of workers.

    The fields are RLinf's (``accel_cluster_size``, ``accel_max_ctas``,
    ``accel_min_ctas``, ``is_high_priority_stream``, ``use_ring_broadcast``, in
    RLinf's order), then rlinf's own ``transport`` and ``timeout``.

    ``transport`` names the transport plugin to use (``None``: the
    ``RLINF_TRANSPORT`` environment variable, else the best usable one for the
    tensors' device).  Both ends of a pair must agree; a mismatch is an error.

    The other fields are RLinf's accelerator tuning knobs (NCCL's
    ``max_ctas``, ``min_ctas``, ``cga_cluster_size`` and a high-priority
    stream).  A device transport honours the ones it declares in its plugin
    descriptor (``TransportPlugin.options``): they configure the pair's device
    link when it is set up, the sender's values first, then the receiver's.  A
    transport ignores a field it cannot honour and says so once at DEBUG level
    (naming the installed transports that do), as RLinf's groups do; a value
    out of range (``accel_max_ctas=64``) fails the call with a ``ValueError``
    before anything is sent.  ``use_ring_broadcast`` is a
    hint for ``broadcast``, which sends from the source to each member.
    ``timeout`` (seconds) bounds a call that passes these options and no ``timeout`` of its own.

    Raises:
        ValueError: a field of the wrong type or out of range, or ``accel_min_ctas > accel_max_ctas``.
    """

    # RLinf's fields, in RLinf's order (so positional arguments mean the same), then rlinf's own
    accel_cluster_size: Optional[int] = None
    accel_max_ctas: Optional[int] = None
    accel_min_ctas: Optional[int] = None
    is_high_priority_stream: bool = False
    use_ring_broadcast: bool = False
    transport: Optional[str] = None
    timeout: Optional[float] = None

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


def honoured(descriptor) -> frozenset:
    """The fields a transport plugin declares (``TransportPlugin.options``; ``extra["options"]`` as before)."""
    return frozenset(getattr(descriptor, "options", ()) or ()) | frozenset(descriptor.extra.get("options", ()))


def link_options(options: Optional[CollectiveGroupOptions], entry) -> dict:
    """The fields ``options`` sets for a device link of transport ``entry`` (a registry entry).

    Raises ``ValueError`` naming the transport and the fields when it cannot
    honour one of them, or when its ``check_options`` refuses the values.
    """
    if options is None:
        return {}
    if not isinstance(options, CollectiveGroupOptions):
        raise TypeError(f"options must be a CollectiveGroupOptions, got {type(options).__name__}")
    wanted = {k: v for k, v in options.transport_options().items() if k in LINK_FIELDS}
    if not wanted:
        return {}
    descriptor = entry.descriptor
    can = honoured(descriptor)
    refused = sorted(k for k in wanted if k not in can)
    if refused:  # ignored, as RLinf's groups do, and said once per (transport, field) at DEBUG
        unsupported_options(options, entry.name, can, _who_can(refused))
        wanted = {k: v for k, v in wanted.items() if k in can}
        if not wanted:
            return {}
    check = getattr(descriptor, "check_options", None)
    reason = check(dict(wanted)) if check is not None else None
    if reason:
        raise ValueError(f"transport {entry.name!r} cannot take CollectiveGroupOptions {wanted}: {reason}")
    return wanted


def _who_can(fields) -> str:
    from . import get_registry

    names = sorted(e.name for e in get_registry().provided["transport"].values()
                   if set(fields) <= honoured(e.descriptor))
    return f"; installed transports that do: {names}" if names else ""


_reported: set = set()
_reported_lock = threading.Lock()


def unsupported_options(options: CollectiveGroupOptions, transport_name: str, supported, who_can: str = "") -> dict:
    """The set fields ``transport_name`` cannot honour; logged once per (transport, field) at DEBUG."""
    ignored = {k: v for k, v in options.transport_options().items() if k not in set(supported or ())}
    with _reported_lock:
        fresh = [k for k in ignored if (transport_name, k) not in _reported]
        _reported.update((transport_name, k) for k in fresh)
    if fresh:
        log.debug("transport %r ignores CollectiveGroupOptions field(s) %s: it does not use them%s",
                  transport_name, fresh, who_can)
    return ignored
