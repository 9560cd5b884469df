"""The plugin system: hook specs, descriptors, discovery and selection."""

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
