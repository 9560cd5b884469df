"""RLinf's worker utilities on ``Worker``: device lock, free ports, profiling, names."""

from __future__ import annotations


class WorkerUtilities:
    """Mixin of ``Worker``: the utilities RLinf's workers call on themselves (filled in below)."""
