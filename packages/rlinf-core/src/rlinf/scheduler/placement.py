"""``rlinf.scheduler.placement``: RLinf's import path of the placement strategies (they live in ``plugins.placement``)."""

from .plugins.component_placement import ComponentPlacement, HybridComponentPlacement, PlacementMode
from .plugins.placement import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementStrategy,
)

__all__ = [
    "ComponentPlacement",
    "FlexiblePlacementStrategy",
    "HybridComponentPlacement",
    "NodePlacementStrategy",
    "PackedPlacementStrategy",
    "PlacementMode",
    "PlacementStrategy",
]
