"""What ``python -m rlinf.scheduler status`` learns from a Ray cluster: its groups.

Every driver keeps its groups in a registry actor (``registry``), named in the
driver's Ray namespace; a status process joins the cluster at ``RAY_ADDRESS``
as a plain Ray client, finds every registry by name across namespaces and
reads their records.  It starts nothing, and asks each worker itself (through
the worker's status listener, see ``rlinf.scheduler.status_server``), not
through its actor, whose calls may be busy.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Optional

from .registry import REGISTRY_ACTOR_NAME


def _reachable(address: str, timeout: float) -> bool:
    """Whether something listens at ``host:port`` (``ray.init`` would retry an unreachable one for long)."""
    host, _, port = address.rpartition(":")
    if host.startswith("ray://") or not port.isdigit():
        return True  # not a plain GCS address: let Ray judge
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
        return True
    except OSError:
        return False


def running_groups(timeout: float) -> Optional[dict]:
    address = os.environ.get("RAY_ADDRESS")
    if not address:
        return None
    deadline = time.monotonic() + timeout
    if not _reachable(address, min(1.0, timeout)):
        raise RuntimeError(f"no Ray cluster answers at RAY_ADDRESS={address}")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR, configure_logging=False)
        except Exception as exc:
            raise RuntimeError(f"cannot join the Ray cluster at {address} (with token authentication on, set "
                               f"RAY_AUTH_MODE=token and RAY_AUTH_TOKEN as for its other clients): {type(exc).__name__}: "
                               f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
    groups, notes = [], []
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry.get("name") != REGISTRY_ACTOR_NAME:
            continue
        namespace = entry.get("namespace")
        try:
            registry = ray.get_actor(REGISTRY_ACTOR_NAME, namespace=namespace)
            left = max(0.1, deadline - time.monotonic())
            names = ray.get(registry.names.remote(), timeout=left)
            records = ray.get([registry.lookup.remote(n) for n in names], timeout=max(0.1, deadline - time.monotonic()))
        except Exception as exc:  # its driver is gone, or it does not answer in time
            notes.append(f"registry in namespace {namespace!r} did not answer: {type(exc).__name__}")
            continue
        groups.extend(r for r in records if r is not None)
    return {"launcher": "ray", "address": address, "groups": groups, "notes": notes}
