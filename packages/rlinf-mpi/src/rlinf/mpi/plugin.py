"""Entry point of the MPI plugin: a launcher and a transport, cheap to import (mpi4py loads on use)."""

from __future__ import annotations

import importlib.util

from rlinf.scheduler.plugins import LauncherPlugin, TransportPlugin, hookimpl


def _check_launcher():
    if importlib.util.find_spec("mpi4py") is None:
        return "the 'mpi4py' package is not installed (pip install mpi4py mpich)"
    return None


def _launcher():
    from .launcher import MpiLauncher

    return MpiLauncher()


def _check_transport():
    from .runtime import active

    if not active():
        return "only inside an rlinf MPI job (mpiexec -n N python -m rlinf.mpi ..., or RLINF_LAUNCHER=mpi)"
    return None


def _transport():
    from .transport import MpiTransport

    return MpiTransport()


@hookimpl
def rlinf_register_launchers():
    return [
        LauncherPlugin(
            name="mpi",
            factory=_launcher,
            priority=50,
            check=_check_launcher,
            description="workers on MPI ranks: mpiexec -n N python -m rlinf.mpi program.py, or spawned ranks",
        )
    ]


@hookimpl
def rlinf_register_transports():
    return [
        TransportPlugin(
            name="mpi",
            factory=_transport,
            priority=20,
            devices=("cpu",),
            check=_check_transport,
            description="MPI point-to-point between the ranks of one rlinf MPI job; GPU tensors staged through host memory",
        )
    ]
