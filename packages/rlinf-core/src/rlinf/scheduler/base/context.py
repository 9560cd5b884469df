"""Process-local state: which worker (if any) this process hosts.

Set by ``WorkerHost`` before the user's class is constructed, so that
``Worker.__init__``, ``Cluster()`` and the communicator find their identity
without being told.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .address import WorkerAddress
from .info import WorkerInfo


@dataclass
class WorkerContext:
    group_key: str
    address: WorkerAddress
    rank: int
    world_size: int
    info: WorkerInfo
    launcher: str
    env: dict = field(default_factory=dict, repr=False)  # holds the cluster secret: never in a repr


_context: Optional[WorkerContext] = None


def current() -> Optional[WorkerContext]:
    return _context


def set_current(ctx: Optional[WorkerContext]) -> None:
    global _context
    _context = ctx
