"""``Cluster``: the driver's (or a worker's) handle on the machines that run workers.

The launcher is a plugin chosen by name (``launcher=`` or ``RLINF_LAUNCHER``)
or, failing that, the highest-priority usable one installed.  One session per
launcher is shared by every ``Cluster`` object in a process.  Connecting also
makes the cluster secret (``rlinf.scheduler.security``) if none was given.
"""

from __future__ import annotations

import threading
from typing import Optional

from . import context, security, worker_logging
from .launcher import LauncherSession
from .placement import NodeInfo
from .plugins import get_registry

_sessions: dict[str, LauncherSession] = {}
_lock = threading.Lock()


def _session_for(launcher: Optional[str], num_nodes: Optional[int], options: dict) -> LauncherSession:
    entry = get_registry().launcher(launcher)
    with _lock:
        session = _sessions.get(entry.name)
        if session is None:
            backend = entry.descriptor.factory()
            ctx = context.current()
            if ctx is not None and ctx.launcher == entry.name:
                session = backend.attach()
            else:
                session = backend.connect(num_nodes or 1, **options)
            session.launcher_name = entry.name
            # made after connecting, so the launcher's own daemons never inherit it; group launches
            # forward it to the workers with the other RLINF_* settings (inside the worker spec)
            security.cluster_secret()
            _sessions[entry.name] = session
    return session


def current_session() -> LauncherSession:
    """The session of this process: the worker's own launcher, or the one the driver chose."""
    ctx = context.current()
    if ctx is not None:
        return _session_for(ctx.launcher, None, {})
    with _lock:
        if len(_sessions) == 1:
            return next(iter(_sessions.values()))
    return _session_for(None, None, {})


class Cluster:
    """The set of nodes workers can be placed on."""

    def __init__(self, num_nodes: Optional[int] = None, launcher: Optional[str] = None, **options):
        worker_logging.take_cluster_options(options)  # distributed_log_dir=
        if num_nodes is not None and (isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1):
            raise ValueError(f"num_nodes must be a positive int, got {num_nodes!r}")
        self._session = _session_for(launcher, num_nodes, options)
        all_nodes = list(self._session.nodes)
        if num_nodes is not None and num_nodes > len(all_nodes):
            raise ValueError(
                f"Cluster(num_nodes={num_nodes}) but the {self._session.launcher_name} cluster has "
                f"{len(all_nodes)} node(s)"
            )
        self._nodes = all_nodes[:num_nodes] if num_nodes else all_nodes

    @property
    def session(self) -> LauncherSession:
        return self._session

    @property
    def launcher_name(self) -> str:
        return self._session.launcher_name

    @property
    def nodes(self) -> list[NodeInfo]:
        return list(self._nodes)

    @property
    def num_nodes(self) -> int:
        return len(self._nodes)

    @property
    def num_accelerators(self) -> int:
        return sum(n.num_gpus for n in self._nodes)

    def shutdown(self) -> None:
        """Stop every worker this process launched and disconnect (an embedded cluster stops)."""
        with _lock:
            for name, session in list(_sessions.items()):
                if session is self._session:
                    del _sessions[name]
        self._session.shutdown()

    def __repr__(self) -> str:
        return f"Cluster(launcher={self.launcher_name!r}, num_nodes={self.num_nodes}, num_accelerators={self.num_accelerators})"
