"""RLinf's routed exchange on ``Worker``: ``send_to`` and ``recv_from``."""

from __future__ import annotations


class RoutedExchange:
    """Mixin of ``Worker``: routed sends and receives between groups (filled in below)."""
