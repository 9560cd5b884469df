"""Entry point of the Ray launcher plugin: cheap to import (Ray is imported on use)."""

from __future__ import annotations

import importlib.util

from rlinf.scheduler.plugins import LauncherPlugin, hookimpl


def _check():
    if importlib.util.find_spec("ray") is None:
        return "the 'ray' package is not installed (pip install ray)"
    return None


def _factory():
    from .launcher import RayLauncher

    return RayLauncher()


@hookimpl
def rlinf_register_launchers():
    return [
        LauncherPlugin(
            name="ray",
            factory=_factory,
            priority=100,
            check=_check,
            description="workers as Ray actors; joins RAY_ADDRESS or starts a local Ray on loopback",
        )
    ]
