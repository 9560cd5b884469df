"""What ``python -m rlinf.scheduler status`` learns from a Ray cluster: its groups.

Every driver keeps its groups in a registry actor (``registry``), named in the
driver's Ray namespace; a status process joins the cluster at ``RAY_ADDRESS``
as a plain Ray client, finds every registry by name across namespaces and
reads their records.  It starts nothing, and asks each worker itself (through
the worker's status listener, see ``rlinf.scheduler.runtime.status_server``), not
through its actor, whose calls may be busy.

A driver that started an embedded cluster (no ``RAY_ADDRESS``) is the only
one that knows its address and its random token: it publishes both in the
user's private status directory (``ray-<host>-<pid>.json``, mode 0600; see
``rlinf.scheduler.tools.status_dir``) while the cluster runs, and the status command
finds the newest such cluster of this machine there when ``RAY_ADDRESS`` is
not set.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from typing import Optional

from rlinf.scheduler.tools.status_dir import process_mark, published, runs_here

from .embedded import listening_tcp
from .loopback import is_loopback_address, stay_on_loopback
from rlinf.scheduler.tools.status_dir import PublishedFile


_file = PublishedFile("ray")


def publish_embedded(address: str, token: Optional[str]) -> None:
    """The driver of an embedded cluster: say where it is, for the status command (best effort)."""
    _file.write({"launcher": "ray", **process_mark(), "address": address, "token": token})


def unpublish_embedded() -> None:
    _file.remove()


def _embedded_clusters() -> list:
    """``(mtime, address, token, pid)`` of every embedded cluster of this machine still running, newest first."""
    found = [(mtime, body["address"], body.get("token"), body.get("pid"))
             for _path, body, mtime in published(f"ray-{socket.gethostname()}-*.json") or ()
             if runs_here(body) and isinstance(body.get("address"), str)]
    return sorted(found, key=lambda entry: -entry[0])


def _program(pid) -> str:
    """The command line of process ``pid`` (shortened), or ``""``."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            parts = [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except (OSError, ValueError, TypeError):
        return ""
    text = " ".join([os.path.basename(parts[0]), *parts[1:]] if parts else [])
    return text if len(text) <= 80 else text[:77] + "..."


def _described(pid) -> str:
    program = _program(pid)
    return f"pid {pid}" + (f" ({program})" if program else "")


def _embedded(pid: Optional[int] = None) -> Optional[tuple]:
    """``(address, token, pid, notes)`` of the embedded cluster of program ``pid``, else of the newest one
    of this machine still running (the notes name the others and how to pick one); None if none runs."""
    found = _embedded_clusters()
    if pid is not None:
        chosen = [entry for entry in found if entry[3] == pid]
        if not chosen:
            running = ", ".join(_described(entry[3]) for entry in found) or "none"
            raise RuntimeError(f"no embedded Ray cluster of pid {pid} runs on this machine (running: {running})")
        return (*chosen[0][1:], [])
    if not found:
        return None
    notes = []
    if len(found) > 1:
        others = ", ".join(_described(entry[3]) for entry in found[1:])
        notes.append(f"{len(found)} programs run an embedded Ray cluster on this machine; shown: the newest.  "
                     f"Also running: {others}.  Show another with: python -m rlinf.scheduler status --pid PID")
    return (*found[0][1:], notes)


def _listener_uid(address: str) -> Optional[int]:
    """The uid owning the socket listening at ``host:port`` (``/proc/net/tcp``); None where that cannot be told."""
    host, _, port = address.rpartition(":")
    try:
        wanted = int(port)
        ip = ipaddress.IPv4Address(socket.inet_aton(host or "127.0.0.1"))
    except (ValueError, OSError):
        return None
    for addr, listen_port, uid, _inode in listening_tcp():
        if listen_port == wanted and (addr == ip or addr.is_unspecified or getattr(addr, "ipv4_mapped", None) == ip):
            return uid
    return None


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


def running_groups(timeout: float, pid: Optional[int] = None) -> Optional[dict]:
    """The groups of the cluster at ``RAY_ADDRESS``, else of the embedded cluster of program ``pid``, else of
    the newest embedded cluster of this machine (with a note naming the others)."""
    address = None if pid is not None else os.environ.get("RAY_ADDRESS")
    shown, notes = address, []
    if not address:
        embedded = _embedded(pid)
        if embedded is None:
            return None
        address, token, pid, notes = embedded
        program = _program(pid)
        shown = f"{address} (the embedded cluster of pid {pid}{', ' + program if program else ''})"
        owner = _listener_uid(address)
        if owner is not None and owner != os.getuid():  # the cluster is gone and someone else took its port
            raise RuntimeError(f"the embedded cluster of pid {pid} published {address}, but uid {owner} listens "
                               f"there now: not sending it the cluster's token")
        if token:  # this cluster's own, never one the shell holds for another cluster
            os.environ["RAY_AUTH_TOKEN"] = token
            os.environ["RAY_AUTH_MODE"] = "token"  # without it Ray's client ignores the token and is refused
    deadline = time.monotonic() + timeout
    if not _reachable(address, min(1.0, timeout)):
        raise RuntimeError(f"no Ray cluster answers at {'RAY_ADDRESS=' + address if shown == address else shown}")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if is_loopback_address(address):  # else Ray's client would look for it at this machine's own address
        stay_on_loopback()
    # Ray reads RAY_AUTH_MODE once, when it is imported: nothing of Ray is imported before this point
    import ray

    from .registry import REGISTRY_ACTOR_NAME

    if not ray.is_initialized():
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR, configure_logging=False)
        except Exception as exc:
            raise RuntimeError(f"cannot join the Ray cluster at {address} (with token authentication on, set "
                               f"RAY_AUTH_MODE=token and RAY_AUTH_TOKEN as for its other clients): {type(exc).__name__}: "
                               f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}") from None
    groups = []
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
    return {"launcher": "ray", "address": shown, "groups": groups, "notes": notes}
