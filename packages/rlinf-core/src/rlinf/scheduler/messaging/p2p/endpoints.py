"""Endpoints a worker process publishes so that peers can reach it."""

from __future__ import annotations


def published_endpoints() -> dict:
    """Transport name -> connection info for this process (filled by the communicator)."""
    from .communicator import local_communicator

    comm = local_communicator(create=True)
    return comm.endpoints() if comm is not None else {}
