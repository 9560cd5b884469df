"""The plugin system: hook specs, descriptors, discovery and selection.

The layer of contracts: what a backend plugs into (hook specs, the launcher and
transport interfaces, placement, accelerator and hardware kinds, cluster
config).  It may import only ``base``.
"""

from .descriptors import AcceleratorPlugin, LauncherPlugin, TransportPlugin
from .hookspecs import hookimpl, hookspec
from .manager import PluginRegistry, get_registry, reset_registry

__all__ = [
    "AcceleratorPlugin",
    "LauncherPlugin",
    "TransportPlugin",
    "hookimpl",
    "hookspec",
    "PluginRegistry",
    "get_registry",
    "reset_registry",
]
