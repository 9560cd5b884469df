"""RLinf's ``Cluster`` helpers: environment variables, free ports, accelerator ranks, profiling, ``allocate``.

``Cluster`` inherits ``ClusterHelpers``.  The environment helpers are RLinf's:
every scheduler variable is ``RLINF_<NAME>`` (``ClusterEnvVar``), and
path-like variables merge per ``RLINF_PATH_ENV_MERGE_MODE`` exactly as the
node groups' ``env_configs`` do here (``plugins.node_env``).

Profiling follows the cluster config's ``profiling`` section as in RLinf
(``backend``, ``enabled``, ``worker_groups``, ``steps``, ``output_dir``, and
for ``nsight`` its ``options``/``flags``): ``ProfileSettings`` reads it,
``modify_profile_context`` renders RLinf's ``nsys profile ...`` command line
for a worker, and ``Worker.start_profile``/``stop_profile`` open and close a
``torch.profiler`` window in the worker (``worker.worker_utilities``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import re
import shlex
import socket
import tempfile
from enum import Enum
from typing import Any, Callable, Mapping, Optional

from ..plugins import node_env

log = logging.getLogger("rlinf.scheduler")


class ClusterEnvVar(str, Enum):
    """RLinf's scheduler environment variables; each is used as ``RLINF_<value>``."""

    CATCH_FAILURE = "CATCH_FAILURE"
    LOG_LEVEL = "LOG_LEVEL"
    TIMEOUT = "TIMEOUT"
    NODE_RANK = "NODE_RANK"
    COMM_NET_DEVICES = "COMM_NET_DEVICES"
    #: a module every worker imports (calling its ``register()``) before its class is built
    EXT_MODULE = "EXT_MODULE"
    PATH_ENV_MERGE_MODE = "PATH_ENV_MERGE_MODE"
    CODE_WORKING_DIR = "CODE_WORKING_DIR"


class PathEnvMergeMode(str, Enum):
    """How path-like worker variables merge: ``append`` (new entries first, then the existing) or ``override``."""

    APPEND = node_env.APPEND
    OVERRIDE = node_env.OVERRIDE


@dataclasses.dataclass
class ProfileSettings:
    """The cluster config's ``profiling`` section (RLinf's ``ProfileConfig``, and ``NsightConfig``'s fields).

    Args:
        backend: the profiler RLinf would wrap workers with (``"nsight"``, ...); required.
        enabled: whether matching groups are profiled.
        worker_groups: the group names profiled (``"all"``: every group); None or empty: none.
        steps: the step indices ``start_profile`` opens a window for; None: every step.
        output_dir: where profiles are written (default: ``default_output_dir()``).
        options: ``nsys profile`` options by name (``nsight``).
        flags: bare ``nsys profile`` flags (``nsight``).
        env: extra variables for the profiled workers (rocprof-sys's ``env``).
    """

    backend: str = ""
    enabled: bool = True
    worker_groups: Optional[list] = None
    steps: Optional[list] = None
    output_dir: Optional[str] = None
    options: Optional[dict] = None
    flags: Optional[list] = None
    env: Optional[dict] = None

    def __post_init__(self):
        if not self.backend:
            raise ValueError("cluster.profiling.backend must be specified (e.g. 'nsight')")
        if isinstance(self.worker_groups, str):
            self.worker_groups = [self.worker_groups]
        if self.worker_groups is not None:
            self.worker_groups = [str(g) for g in self.worker_groups]
        if self.steps is not None:
            if isinstance(self.steps, (str, bytes)) or not hasattr(self.steps, "__iter__"):
                raise ValueError(f"cluster.profiling.steps must be a list of ints, got {self.steps!r}")
            self.steps = [int(s) for s in self.steps]
            if any(s < 0 for s in self.steps):
                raise ValueError(f"cluster.profiling.steps must be non-negative ints, got {self.steps}")
        if isinstance(self.flags, str):
            self.flags = [self.flags]
        if self.options is not None:
            self.options = {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in self.options.items()}
        if self.backend == "nsight" and self.steps is not None:  # RLinf: step gating needs the profiler API range
            self.options = dict(self.options or {})
            self.options.setdefault("capture-range", "cudaProfilerApi")
            self.options.setdefault("capture-range-end", "stop")

    @classmethod
    def from_config(cls, section: Any) -> Optional["ProfileSettings"]:
        """The settings of a ``profiling`` section (a mapping, or one already parsed); None for None.

        Raises:
            ValueError: no backend, bad steps, or an unknown field.
        """
        if section is None or isinstance(section, cls):
            return section
        if not isinstance(section, Mapping):
            raise ValueError(f"cluster.profiling must be a mapping, got {type(section).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise ValueError(f"unknown cluster.profiling fields {unknown}; known: {sorted(known)}")
        return cls(**dict(section))

    def profiles_worker_group(self, worker_group_name: str) -> bool:
        """Whether workers of this group are profiled (RLinf's rule: ``all`` or the name, case-insensitive)."""
        if not self.enabled or not self.worker_groups:
            return False
        names = {g.lower() for g in self.worker_groups}
        return "all" in names or worker_group_name.lower() in names

    def should_profile_step(self, step_idx: int) -> bool:
        """Whether step ``step_idx`` is profiled (every step when ``steps`` is None)."""
        return self.enabled and (self.steps is None or step_idx in self.steps)

    def nsys_tokens(self, output_prefix: str) -> list[str]:
        """RLinf's ``nsys profile`` arguments: flags, then options (``-o prefix`` unless given)."""
        options = dict(self.options or {})
        if "output" not in options:
            options.setdefault("o", output_prefix)
        tokens = [f"--{f}" if len(f) > 1 else f"-{f}" for f in self.flags or []]
        for name, value in options.items():
            tokens.extend([f"--{name}={value}"] if len(name) > 1 else [f"-{name}", value])
        return tokens


def default_profile_output_dir() -> str:
    """Where profiles go when the section names no ``output_dir``: ``$TMPDIR/rlinf-profiles-<uid>`` (0700)."""
    from ..base import security

    return security.private_dir(os.path.join(tempfile.gettempdir(), f"rlinf-profiles-{os.geteuid()}"))


def profile_output_prefix(worker_name: str, output_dir: str) -> str:
    """RLinf's per-worker output prefix: ``<output_dir>/rlinf_profile_<worker name, sanitised>_%p``."""
    return os.path.join(output_dir, f"rlinf_profile_{re.sub(r'[^A-Za-z0-9._-]', '_', worker_name)}_%p")


#: ``fn(cluster, cls, worker_name, node_rank, max_concurrency, env_vars, node_group_label, cls_args,
#: cls_kwargs)`` launching one worker: registered by ``rlinf.scheduler.cluster`` (it needs the groups above)
_allocator: Optional[Callable] = None


def provide_allocator(fn: Callable) -> Callable:
    """Register the implementation of ``Cluster.allocate``."""
    global _allocator
    _allocator = fn
    return fn


class ClusterHelpers:
    """RLinf's class-level and instance helpers of ``Cluster`` (mixed into it)."""

    SYS_NAME = "RLinf"
    DEFAULT_SYS_ENV_VAR = {
        ClusterEnvVar.CATCH_FAILURE: "0",
        ClusterEnvVar.LOG_LEVEL: "INFO",
        ClusterEnvVar.TIMEOUT: "180",
        ClusterEnvVar.NODE_RANK: None,
        ClusterEnvVar.COMM_NET_DEVICES: None,
        ClusterEnvVar.EXT_MODULE: None,
        ClusterEnvVar.PATH_ENV_MERGE_MODE: PathEnvMergeMode.APPEND.value,
        ClusterEnvVar.CODE_WORKING_DIR: "0",
    }
    PATH_LIKE_ENV_VARS = set(node_env.PATH_LIKE_ENV_VARS)

    @classmethod
    def find_free_port(cls, max_port_num: Optional[int] = None) -> int:
        """A TCP port nothing on this node listens on now (the kernel's pick); nothing holds it afterwards.

        ``Worker.acquire_free_port()`` also keeps it from every other worker of the node.

        Args:
            max_port_num (int | None): the largest acceptable port (RLinf's argument: for a server that
                derives a second port from this one and would overflow past 65535).  The kernel picks
                from its ephemeral range; below that range a port is drawn from 1024..max_port_num.

        Raises:
            ValueError: ``max_port_num`` is not an int in 1024..65535.
            RuntimeError: no free port at most ``max_port_num`` was found in 1000 tries.
        """
        if max_port_num is not None and (isinstance(max_port_num, bool) or not isinstance(max_port_num, int)
                                         or not 1024 <= max_port_num <= 65535):
            raise ValueError(f"max_port_num must be an int in 1024..65535, got {max_port_num!r}")
        for _ in range(1000):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                port = s.getsockname()[1]
            if max_port_num is None or port <= max_port_num:
                return port
            candidate = random.randint(1024, max_port_num)  # the kernel's range lies above the limit
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("", candidate))
                except OSError:
                    continue
                return candidate
        raise RuntimeError(f"Failed to find a free port at most {max_port_num}.")

    @staticmethod
    def get_full_env_var_name(var) -> str:
        """``RLINF_<name>`` for a ``ClusterEnvVar`` (or its name as a str).

        Args:
            var (ClusterEnvVar | str): the variable.
        """
        return f"{ClusterHelpers.SYS_NAME.upper()}_{ClusterEnvVar(var).value}"

    @staticmethod
    def get_sys_env_var(env_var, default: Optional[str] = None) -> Optional[str]:
        """This process's value of ``RLINF_<env_var>``, or ``default``.

        Args:
            env_var (ClusterEnvVar | str): the variable.
            default: returned when it is unset.
        """
        return os.environ.get(ClusterHelpers.get_full_env_var_name(env_var), default)

    @classmethod
    def get_path_env_merge_mode(cls, env_vars: Mapping) -> PathEnvMergeMode:
        """``RLINF_PATH_ENV_MERGE_MODE`` of ``env_vars``: ``append`` unless set; an invalid value logs and appends.

        Args:
            env_vars: the variables to read it from.
        """
        return PathEnvMergeMode(node_env.merge_mode(env_vars))

    @classmethod
    def merge_worker_env_vars(cls, base_env_vars: Mapping, incoming_env_vars: Mapping, mode) -> dict:
        """``base_env_vars`` updated with ``incoming_env_vars``; path-like ones in ``append`` mode keep both lists.

        Args:
            base_env_vars: the variables so far.
            incoming_env_vars: the ones to apply over them.
            mode (PathEnvMergeMode | str): ``append`` (incoming entries first, then the existing, each once) or
                ``override``.
        """
        mode = PathEnvMergeMode(mode).value
        merged = dict(base_env_vars)
        for key, value in incoming_env_vars.items():
            merged[key] = node_env.merge_value(key, merged.get(key), value, mode)
        return merged

    @property
    def accelerator_ranks(self) -> list[list[int]]:
        """Each node's global accelerator ranks: node 0's from 0, then node 1's, ... (RLinf's numbering)."""
        ranks, start = [], 0
        for node in self.nodes:
            ranks.append(list(range(start, start + node.num_gpus)))
            start += node.num_gpus
        return ranks

    @property
    def profiling(self) -> Optional[ProfileSettings]:
        """The cluster config's ``profiling`` section as ``ProfileSettings``, or None."""
        cfg = self.cluster_cfg
        return None if cfg is None else ProfileSettings.from_config(cfg.get("profiling"))

    @classmethod
    def modify_profile_context(cls, python_interpreter_path: str, worker_name: str, profiling_cfg: Any) -> str:
        """The command that runs a worker's interpreter under the profiler, as RLinf builds it.

        ``nsight`` profiling of the worker's group gives ``nsys profile <flags> <options> -o <prefix> <python>``
        (prefix: ``profile_output_prefix``); anything else gives ``python_interpreter_path`` unchanged.  The
        launchers here start workers with their own interpreter; ``Worker.start_profile`` is what profiles.

        Args:
            python_interpreter_path: the interpreter.
            worker_name: the worker's name (``WorkerAddress.get_name()``); its group decides.
            profiling_cfg (ProfileSettings | Mapping | None): the ``profiling`` section.
        """
        settings = ProfileSettings.from_config(profiling_cfg)
        if settings is None or settings.backend != "nsight" or not settings.profiles_worker_group(
                worker_name.split(":")[0]):
            return python_interpreter_path
        prefix = profile_output_prefix(worker_name, settings.output_dir or default_profile_output_dir())
        return " ".join(shlex.quote(t) for t in ["nsys", "profile", *settings.nsys_tokens(prefix), python_interpreter_path])

    @classmethod
    def get_profiling_env_vars_for_worker(cls, worker_name: str, profiling_cfg: Any) -> dict:
        """The variables a profiled worker gets, as in RLinf: rocprof-sys's output path and prefix (and the
        section's ``env``); ``{}`` for other backends and for groups not profiled.

        Args:
            worker_name: the worker's name; its group decides.
            profiling_cfg (ProfileSettings | Mapping | None): the ``profiling`` section.
        """
        settings = ProfileSettings.from_config(profiling_cfg)
        if settings is None or not settings.profiles_worker_group(worker_name.split(":")[0]):
            return {}
        if settings.backend not in ("rocprof-sys", "rocprofsys", "rocprof"):
            return dict(settings.env or {})
        prefix = profile_output_prefix(worker_name, settings.output_dir or default_profile_output_dir())
        env = {"ROCPROFSYS_OUTPUT_PATH": os.path.dirname(prefix), "ROCPROFSYS_OUTPUT_PREFIX": os.path.basename(prefix)}
        env.update(settings.env or {})
        return env

    def allocate(self, cls: type, worker_name: str, worker_rank: int = 0, node_rank: int = 0,
                 max_concurrency: Optional[int] = None, env_vars: Optional[dict] = None,
                 node_group_label: Optional[str] = None, disable_distributed_log: bool = False,
                 cls_args: tuple = (), cls_kwargs: Optional[dict] = None):
        """Start one worker of ``cls`` on node ``node_rank`` with ``env_vars`` (RLinf's building block of a launch).

        The worker is a group of one named after ``worker_name``'s group (``"actor:0"`` -> ``"actor"``),
        placed on the node; ``env_vars`` are merged over the node group's ``env_configs`` (path-like ones per
        ``RLINF_PATH_ENV_MERGE_MODE``).  RLinf returns the Ray actor; here the launched ``WorkerGroup`` is
        returned, whose calls reach the worker on any launcher.

        Args:
            cls: the ``Worker`` subclass.
            worker_name: the worker's name; its part before ``:`` names the group.
            worker_rank: RLinf's rank of the worker in its group; here the worker is rank 0 of its own group.
            node_rank: the node to start it on.
            max_concurrency: most calls it runs at once.
            env_vars: variables set in the worker.
            node_group_label: the node group placing it (its ``env_configs`` apply).
            disable_distributed_log: accepted for RLinf's signature.
            cls_args: positional arguments of ``cls``.
            cls_kwargs: keyword arguments of ``cls``.

        Raises:
            ValueError: ``node_rank`` is not a node of this cluster.
            GroupNameError: a group of that name is running.
            LaunchError: the worker failed to start.
        """
        if isinstance(node_rank, bool) or not isinstance(node_rank, int) or not 0 <= node_rank < len(self.nodes):
            raise ValueError(f"Invalid node_id: {node_rank!r}. Must be between 0 and {len(self.nodes) - 1}.")
        if _allocator is None:
            raise RuntimeError("Cluster.allocate needs rlinf.scheduler.cluster imported (import rlinf.scheduler)")
        return _allocator(self, cls, worker_name, node_rank, max_concurrency, dict(env_vars or {}), node_group_label,
                          tuple(cls_args), dict(cls_kwargs or {}))
