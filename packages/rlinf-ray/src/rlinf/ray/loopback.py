"""Joining a Ray cluster on loopback from a machine that has a network address.

Ray's client takes ``127.0.0.1`` (or ``localhost``) for "this node" and, unless
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` was set when Ray was imported, connects
to the machine's own address instead: an embedded cluster, which listens on
loopback only, is then unreachable on every machine with a network address,
and Ray would start one listening on every address.  Off, Ray takes loopback
as this node's address, which is right for a cluster on loopback (all of its
nodes are this machine) and wrong for one that spans machines: so the switch
is turned off for a loopback target only, whatever the environment says.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from typing import Optional

#: Ray's switch (read once, when Ray is imported, into ``ray_constants.ENABLE_RAY_CLUSTER``)
SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback_address(address: Optional[str]) -> bool:
    """Whether ``host:port`` (or ``host``) names this machine's loopback: ``127.x``, ``::1``, ``localhost``."""
    if not address:
        return False
    host = address.split("://", 1)[-1]
    if host.startswith("["):  # [v6]:port
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:  # host:port (a bare v6 address has more colons)
        host = host.partition(":")[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: the switch as it was before ``stay_on_loopback`` first turned it off: (environment value, Ray's constant)
_before: Optional[tuple] = None


def _ray_constants():
    if "ray" not in sys.modules:
        return None
    try:
        from ray._private import ray_constants
    except ImportError:
        return None
    return ray_constants if hasattr(ray_constants, "ENABLE_RAY_CLUSTER") else None


def stay_on_loopback() -> None:
    """Turn Ray's switch off, in the environment (for a Ray imported later, and the processes started
    from here) and in an already imported Ray, which read it at import (a Ray without the constant is
    left as it is)."""
    global _before
    constants = _ray_constants()
    if _before is None:
        _before = (os.environ.get(SWITCH), None if constants is None else constants.ENABLE_RAY_CLUSTER)
    os.environ[SWITCH] = "0"
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False


def leave_loopback() -> None:
    """Put the switch back as it was before ``stay_on_loopback``: a driver that had an embedded cluster and
    then joins one that spans machines (after ``ray.shutdown()``) must give its own address, not loopback."""
    global _before
    if _before is None:
        return
    env, constant = _before
    _before = None
    if env is None:
        os.environ.pop(SWITCH, None)
    else:
        os.environ[SWITCH] = env
    constants = _ray_constants()
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = constant if constant is not None else env != "0"


def follow(address: Optional[str]) -> None:
    """The switch for a cluster at ``address`` (``None``: an embedded one): off for loopback, never for a
    cluster that spans machines (as the user's environment had it, if an earlier cluster here was on loopback)."""
    if not address or is_loopback_address(address):
        stay_on_loopback()
    else:
        leave_loopback()
