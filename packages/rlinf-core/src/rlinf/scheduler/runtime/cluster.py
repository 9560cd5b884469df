"""``Cluster``: the driver's (or a worker's) handle on the machines that run workers.

The launcher is a plugin chosen by name (``launcher=`` or ``RLINF_LAUNCHER``)
or, failing that, the highest-priority usable one installed; inside a worker,
the worker's own launcher.  One session per launcher is shared by every
``Cluster`` object in a process, and so is the first explicit choice of
nodes and configuration: as in RLinf, ``Cluster()`` after
``Cluster(num_nodes=2)`` (or ``Cluster(cluster_cfg=...)``) is the same cluster.
Connecting also makes the cluster secret (``rlinf.scheduler.base.security``) if
none was given.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any, Optional

from ..base import config, context, progress, security, worker_logging
from ..base.errors import MORE_NODES_HINT, ClusterConfigError, PluginError
from ..plugins import accelerator as _accelerator
from ..plugins import hardware as _hardware
from ..plugins.cluster_config import ClusterConfig
from ..plugins.launcher import LauncherSession, provide_current_session
from ..plugins.placement import NodeInfo
from ..plugins import get_registry
from .. import tracing
from ..base.hooks import hook
from .cluster_helpers import ClusterHelpers

_sessions: dict[str, LauncherSession] = {}
_lock = threading.Lock()
#: sessions ended by ``Cluster.shutdown`` (every cluster object sharing one sees it ended)
_ended: "weakref.WeakSet[LauncherSession]" = weakref.WeakSet()


#: ``fn(session)`` for each session ``Cluster.shutdown`` ends: the layers above (the groups) forget theirs
_on_shutdown: list = []


def on_shutdown(fn):
    """Register ``fn(session)``, run when a session is shut down in this process."""
    _on_shutdown.append(fn)
    return fn


def is_ended(session) -> bool:
    """Whether ``session`` was shut down (its groups are gone with it), by ``Cluster.shutdown`` or under it
    (``ray.shutdown()``: then it is dropped now, and the next ``Cluster()`` connects afresh)."""
    if session in _ended:
        return True
    if session.connected():
        return False
    with _lock:
        for name, known in list(_sessions.items()):
            if known is session:
                del _sessions[name]
    session.discard()
    _end_session(session)
    return True

def _driver_session() -> Optional[LauncherSession]:
    with _lock:
        return next(iter(_sessions.values()), None)


tracing.provide_runtime(_driver_session, is_ended)

#: seconds ``Cluster(num_nodes=N)`` waits for N nodes to join before it gives up
NODE_WAIT_TIMEOUT_ENV = "RLINF_NODE_WAIT_TIMEOUT"
DEFAULT_NODE_WAIT_TIMEOUT = 300.0
_POLL = 0.5


def _end_session(session: LauncherSession) -> None:
    """``session`` is over: its groups end with it (``on_shutdown``)."""
    _ended.add(session)
    for fn in list(_on_shutdown):
        fn(session)


def _session_for(launcher: Optional[str], num_nodes: Optional[int], options: dict) -> LauncherSession:
    entry = get_registry().launcher(launcher)
    with _lock:
        session = _sessions.get(entry.name)
        if session is not None and not session.connected():
            # its connection went away under it (``ray.shutdown()`` in the program): start afresh
            del _sessions[entry.name]
            session.discard()
            _ended.add(session)
            stale = session
            session = None
        else:
            stale = None
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
    if stale is not None:
        _end_session(stale)  # its groups end with it (outside the lock: the callbacks may take their own)
    tracing.on_driver_connect()  # RLINF_TRACE: record from now on, write the file at exit
    return session


@provide_current_session
def current_session() -> LauncherSession:
    """The session of this process: the worker's own launcher, or the one the driver chose."""
    ctx = context.current()
    if ctx is not None:
        return _session_for(ctx.launcher, None, {})
    with _lock:
        if len(_sessions) == 1:
            return next(iter(_sessions.values()))
    return _session_for(None, None, {})


def _plain_config(cluster_cfg: Any) -> dict:
    """RLinf's ``cluster`` config section as a plain dict (it may be an OmegaConf object)."""
    if isinstance(cluster_cfg, Mapping):
        cfg = dict(cluster_cfg)
    else:
        try:
            from omegaconf import DictConfig, OmegaConf
        except ImportError:
            DictConfig = None
        if DictConfig is None or not isinstance(cluster_cfg, DictConfig):
            raise TypeError(f"cluster_cfg must be a dict or an OmegaConf DictConfig, got {type(cluster_cfg).__name__}")
        cfg = OmegaConf.to_container(cluster_cfg, resolve=True)
    try:  # nested OmegaConf nodes inside a plain dict
        from omegaconf import OmegaConf

        cfg = {k: OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v for k, v in cfg.items()}
    except ImportError:
        pass
    num = cfg.get("num_nodes")
    if isinstance(num, bool) or not isinstance(num, int) or num < 1:
        raise ValueError(f"cluster_cfg.num_nodes must be a positive int, got {num!r}")
    groups = cfg.get("node_groups")
    if groups is not None:
        if not isinstance(groups, (list, tuple)) or not all(isinstance(g, Mapping) for g in groups):
            raise ValueError(f"cluster_cfg.node_groups must be a list of mappings, got {groups!r}")
        labels = [g.get("label") for g in groups]
        if any(not isinstance(label, str) or not label for label in labels):
            raise ValueError(f"every entry of cluster_cfg.node_groups needs a non-empty 'label', got {labels!r}")
        if len(set(labels)) != len(labels):
            raise ValueError(f"cluster_cfg.node_groups labels must be unique, got {labels!r}")
    placement = cfg.get("component_placement")
    if placement is not None and not isinstance(placement, Mapping):
        raise ValueError(f"cluster_cfg.component_placement must be a mapping, got {placement!r}")
    return cfg


def _parsed_config(cfg: dict) -> ClusterConfig:
    """``ClusterConfig`` of the plain section, every RLinf check applied; errors say it is the cluster_cfg."""
    try:
        return ClusterConfig.from_dict_cfg(cfg)
    except ClusterConfigError as exc:
        text = str(exc)
        raise ClusterConfigError(text if "cluster_cfg" in text else f"invalid cluster_cfg: {text}") from None


def _node_hardware(node: NodeInfo, config: Optional[ClusterConfig]) -> NodeInfo:
    """``node`` with its node-group labels and hardware resources (accelerators, configured robots) filled in."""
    try:
        rlinf_type = _accelerator.get(node.accelerator).rlinf_type if node.accelerator else "NV_GPU"
    except PluginError:
        rlinf_type = node.accelerator.upper()
    accel = _hardware.accelerator_resource(node.num_gpus, node.accelerator or "gpu", rlinf_type)
    if config is None:
        resources = [accel] if accel is not None else []
        return dataclasses.replace(node, hardware_resources=tuple(resources))
    resources = _hardware.enumerate_node(node.node_rank, config.get_node_hw_configs_by_type(node.node_rank), accel)
    return dataclasses.replace(
        node,
        node_labels=tuple(config.get_node_labels_by_rank(node.node_rank)),
        hardware_resources=tuple(resources),
        # which group owns the robots of this node: a group without hardware sharing the node counts nodes
        node_group_hardware=tuple((g.label, g.hardware_type) for g in config.node_groups or []
                                  if node.node_rank in g.node_ranks and g.hardware is not None),
    )


def _wait_for_nodes(session: LauncherSession, wanted: int, timeout: float) -> list[NodeInfo]:
    """The session's nodes once ``wanted`` have joined; bounded by ``timeout``, saying what it waits for (``progress``)."""
    start = time.monotonic()
    with progress.Progress() as line:
        while True:
            nodes = list(session.nodes)
            if len(nodes) >= wanted:
                line.close(f"{len(nodes)} node(s) joined the {session.launcher_name} cluster")
                return nodes
            now = time.monotonic()
            if now - start >= timeout:
                raise TimeoutError(
                    f"Cluster(num_nodes={wanted}): only {len(nodes)} node(s) joined the {session.launcher_name} cluster "
                    f"within {timeout:.0f} s; start the missing nodes (ray start --address=...) or ask for fewer "
                    f"(the wait is set by {NODE_WAIT_TIMEOUT_ENV})"
                )
            line.update(f"waiting for {wanted} node(s) to join the {session.launcher_name} cluster: {len(nodes)} joined "
                        f"so far, {sum(n.num_gpus for n in nodes)} accelerator(s); giving up after {timeout:.0f} s")
            time.sleep(min(_POLL, max(0.0, start + timeout - now)))
            session.refresh_nodes()


class Cluster(ClusterHelpers):
    """The set of nodes workers can be placed on.

    Made once in the driver (and again, to the same cluster, inside any worker
    that launches groups of its own).  A first ``Cluster()`` starts or joins
    the launcher's cluster; later ones in the process share it.

    Args:
        num_nodes: use the first N nodes, waiting (at most
            ``RLINF_NODE_WAIT_TIMEOUT`` seconds, 300 by default) until N have
            joined a cluster that nodes can join (an embedded one cannot: too
            few nodes is an error at once); ``None`` or 0: every alive node.
        cluster_cfg: RLinf's ``cluster`` section (``num_nodes``,
            ``component_placement``, ``node_groups``), a dict or an OmegaConf object.
        distributed_log_dir: a directory (created if needed) where every worker
            launched afterwards from this process also writes its log lines, one
            file per worker, ``<dir>/<worker address>.log`` (RLinf splits each
            worker's Ray log into ``<dir>/<group>/rank_<rank>.log``).
        launcher: the launcher plugin's name (default: the one installed, or
            inside a worker the worker's own).
        **options (Any): passed to the launcher (for Ray: ``address``,
            ``temp_dir``, ``num_cpus``, ...).

    Raises:
        ValueError: a bad ``num_nodes``, a ``cluster_cfg`` that disagrees with it, too few nodes where none
            can join.
        ClusterConfigError: an invalid ``cluster_cfg`` (before connecting).
        TypeError: ``distributed_log_dir`` is not a path, ``cluster_cfg`` not a mapping.
        PermissionError: another user could redirect ``distributed_log_dir`` (a link of theirs on the
            way to it, or a directory above it they own or may write to); the message names it and the fix.
        TimeoutError: fewer than ``num_nodes`` nodes joined in time.

    Example:
        ```python
        cluster = Cluster(num_nodes=1)
        group = MyWorker.create_group().launch(cluster, PackedPlacementStrategy(0, 3), name="actor")
        ```
    """

    def __init__(
        self,
        num_nodes: Optional[int] = None,
        cluster_cfg: Any = None,
        distributed_log_dir: Optional[str] = None,
        launcher: Optional[str] = None,
        **options,
    ):
        worker_logging.take_cluster_options({"distributed_log_dir": distributed_log_dir})
        if num_nodes is not None and (isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0):
            raise ValueError(f"num_nodes must be a non-negative int, got {num_nodes!r}")
        cfg = _plain_config(cluster_cfg) if cluster_cfg is not None else None
        if cfg is not None:
            _parsed_config(cfg)  # every RLinf check, before connecting
            if num_nodes and num_nodes != cfg["num_nodes"]:
                raise ValueError(
                    f"Cluster(num_nodes={num_nodes}) does not match cluster_cfg.num_nodes={cfg['num_nodes']}"
                )
            num_nodes = cfg["num_nodes"]
        ctx = context.current()
        if launcher is None and ctx is not None:
            launcher = ctx.launcher  # inside a worker: the worker's own cluster
        wait_timeout = options.pop("node_wait_timeout", None)
        if wait_timeout is None:
            wait_timeout = config._float_env(NODE_WAIT_TIMEOUT_ENV, DEFAULT_NODE_WAIT_TIMEOUT)
        self._session = _session_for(launcher, num_nodes, options)
        session = self._session
        with _lock:  # the first explicit choice in this process is the cluster's
            first = session.chosen_num_nodes is None and session.cluster_cfg is None
            if cfg is not None and session.cluster_cfg is None:
                session.cluster_cfg = cfg
            if num_nodes and session.chosen_num_nodes is None:
                session.chosen_num_nodes = num_nodes
        if ctx is None and first and (num_nodes or cfg is not None):
            # the driver's choice is its workers' too (the first one published wins)
            chosen = session.publish_cluster({"num_nodes": session.chosen_num_nodes, "cluster_cfg": session.cluster_cfg})
            session.chosen_num_nodes, session.cluster_cfg = chosen["num_nodes"], chosen["cluster_cfg"]
        elif ctx is not None and first and not num_nodes and cfg is None:
            chosen = session.published_cluster()  # inside a worker: the driver's cluster
            if chosen:
                session.chosen_num_nodes, session.cluster_cfg = chosen["num_nodes"], chosen["cluster_cfg"]
        self._cfg = cfg if cfg is not None else session.cluster_cfg
        if not num_nodes:
            num_nodes = session.chosen_num_nodes
        all_nodes = list(session.nodes)
        if num_nodes and num_nodes > len(all_nodes):
            if not session.nodes_can_join:
                raise ValueError(
                    f"Cluster(num_nodes={num_nodes}) but the {session.launcher_name} cluster has "
                    f"{len(all_nodes)} node(s), and no node can join it; {MORE_NODES_HINT}"
                )
            all_nodes = _wait_for_nodes(session, num_nodes, wait_timeout)
        self._nodes = all_nodes[:num_nodes] if num_nodes else all_nodes
        self._config = _parsed_config(self._cfg) if self._cfg is not None else None
        self._nodes = [_node_hardware(node, self._config) for node in self._nodes]
        if self._cfg is not None:
            tracing.on_cluster_config(self, self._cfg)  # RLinf's ``tracer`` section: record and write at exit

    @classmethod
    def has_initialized(cls) -> bool:
        """Whether this process has a cluster connected (a ``Cluster`` made and not shut down)."""
        with _lock:
            sessions = list(_sessions.values())
        return any(s.connected() for s in sessions)

    @staticmethod
    def get_alive_nodes() -> list[NodeInfo]:
        """The nodes alive in this process's cluster now, ``NodeInfo`` each (RLinf: Ray's node records)."""
        session = current_session()
        session.refresh_nodes()
        return list(session.nodes)

    @property
    def session(self) -> LauncherSession:
        """The launcher's session behind this cluster (``LauncherSession``): for plugins and tools."""
        return self._session

    @property
    def launcher_name(self) -> str:
        """The name of the launcher plugin that runs this cluster's workers (``"ray"``, ``"cpu"``, ``"mpi"``)."""
        return self._session.launcher_name

    @property
    def nodes(self) -> list[NodeInfo]:
        """The nodes in use, ``NodeInfo`` each, in node-rank order (a copy)."""
        return list(self._nodes)

    @property
    def num_nodes(self) -> int:
        """How many nodes this cluster uses."""
        return len(self._nodes)

    @property
    def num_accelerators(self) -> int:
        """How many accelerators (GPUs, NPUs, ...) the nodes in use have together."""
        return sum(n.num_gpus for n in self._nodes)

    @property
    def cluster_cfg(self) -> Optional[dict]:
        """The ``cluster`` config this cluster was made with (a plain dict), or None."""
        return self._cfg

    @property
    def cluster_config(self) -> Optional[ClusterConfig]:
        """The ``cluster`` config parsed as RLinf's ``ClusterConfig`` (node groups, hardware), or None."""
        return self._config

    @property
    def component_placement(self) -> Optional[dict]:
        """The ``component_placement`` section of ``cluster_cfg``, or None without a config."""
        return None if self._cfg is None else self._cfg.get("component_placement")

    @property
    def node_groups(self) -> list[dict]:
        """The ``node_groups`` entries of ``cluster_cfg`` (dicts); empty without a config."""
        return [] if self._cfg is None else list(self._cfg.get("node_groups") or [])

    def get_node_group(self, label: str) -> Optional[dict]:
        """The ``node_groups`` entry with this label (its node ranks, env vars, ...), or None.

        Args:
            label: the node group's ``label`` in ``cluster_cfg``.
        """
        return next((g for g in self.node_groups if g.get("label") == label), None)

    def get_node_info(self, node_rank: int) -> NodeInfo:
        """The ``NodeInfo`` of one node in use (IP, accelerators, hardware).

        Args:
            node_rank: the node's rank, ``0 .. num_nodes - 1``.

        Raises:
            ValueError: ``node_rank`` is not a node rank of this cluster.
        """
        if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < len(self._nodes):
            raise ValueError(f"invalid node rank {node_rank!r}: this cluster has nodes 0..{len(self._nodes) - 1}")
        return self._nodes[node_rank]

    def get_node_ip(self, node_rank: int) -> str:
        """The IP address of one node in use.

        Args:
            node_rank: the node's rank, ``0 .. num_nodes - 1``.

        Raises:
            ValueError: ``node_rank`` is not a node rank of this cluster.
        """
        return self.get_node_info(node_rank).ip

    def trace(self, path) -> "tracing.TraceBlock":
        """Record a timeline of a ``with`` block (every worker's spans) into a file.

        Args:
            path (str | os.PathLike): the Chrome-trace JSON file written when the block ends.

        Example:
            ```python
            with cluster.trace("run.json"):
                group.step().wait(timeout=600)  # every wait bounded
            ```
        """
        return tracing.TraceBlock(self, path)

    def dump_trace(self, path) -> str:
        """Write what has been traced so far (``RLINF_TRACE`` or a ``trace()`` block) to ``path`` now.

        Args:
            path (str | os.PathLike): the Chrome-trace JSON file to write.

        Returns:
            The path written.
        """
        return tracing.dump(self, path)

    @hook("cluster_shutdown")
    def shutdown(self) -> None:
        """Stop every group this process launched and disconnect (an embedded cluster stops)."""
        with _lock:
            for name, session in list(_sessions.items()):
                if session is self._session:
                    del _sessions[name]
        try:
            self._session.shutdown()
        finally:
            _end_session(self._session)

    def __repr__(self) -> str:
        return f"Cluster(launcher={self.launcher_name!r}, num_nodes={self.num_nodes}, num_accelerators={self.num_accelerators})"
