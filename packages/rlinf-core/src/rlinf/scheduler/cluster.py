"""``rlinf.scheduler.cluster``: RLinf's import path of ``Cluster`` (it lives in ``runtime.cluster``)."""

from .runtime.cluster import Cluster

__all__ = ["Cluster"]
