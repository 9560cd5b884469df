"""Options for one pair of communicating workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import config


@dataclass
class CollectiveGroupOptions:
    """Transport options for a pair of workers.

    ``transport`` names the transport plugin to use (``None``: the
    ``RLINF_TRANSPORT`` environment variable, else the best usable one for the
    tensors' device).  Both ends of a pair must agree; a mismatch is an error.
    """

    transport: Optional[str] = None
    timeout: Optional[float] = None

    def __post_init__(self):
        if self.transport is not None and (not isinstance(self.transport, str) or not self.transport):
            raise ValueError(f"CollectiveGroupOptions.transport must be a non-empty str or None, got {self.transport!r}")
        config.check_timeout(self.timeout, "CollectiveGroupOptions.timeout")
