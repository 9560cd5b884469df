"""RLinf's path to ``CollectiveGroupOptions``; defined in ``rlinf.scheduler.p2p.options``."""

from .p2p.options import CollectiveGroupOptions

__all__ = ["CollectiveGroupOptions"]
