"""RLinf's path to ``CollectiveGroupOptions``; defined in ``rlinf.scheduler.plugins.options``."""

from .plugins.options import CollectiveGroupOptions

__all__ = ["CollectiveGroupOptions"]
