"""The software environment a cluster config gives a node: ``node_groups[].env_configs``.

A node group's ``env_configs`` entries set environment variables and a
Python interpreter for some of the group's nodes.  Every worker placed on
such a node gets them.  The group launch finds them for the worker's node
(``for_node``) and hands them to the launcher inside the worker spec's
environment, under ``NODE_ENV_KEY``, as JSON.  The launcher starts the
worker process with them where it can (Ray: the actor's ``runtime_env``,
``env_vars`` and ``py_executable``); the worker host then applies them to
the process (``apply``), which is all a launcher whose processes already run
(MPI) can do.

Path-like variables (``PATH``, ``PYTHONPATH``, ``LD_LIBRARY_PATH``, ...; see
``PATH_LIKE_ENV_VARS``) follow ``RLINF_PATH_ENV_MERGE_MODE`` as in RLinf:
``append`` (the default) puts the configured entries in front of the ones the
node already has, without duplicates; ``override`` replaces the node's
value.  Any other value logs an error and means ``append``.  The mode is the
launching process's (forwarded with the other ``RLINF_*`` settings), else the
node's; a node group's own ``env_vars`` setting of it does not change how
that group's variables merge, as in RLinf.

Precedence, lowest first (RLinf's): the node's environment and the
launching process's ``RLINF_*`` settings, then the node group's ``env_vars``,
then what the launch sets itself (``RANK``, ``MASTER_ADDR``, ...).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from ..base.errors import ClusterConfigError

#: key of a worker spec's environment that carries the worker node's ``NodeEnv`` (JSON); never a process variable
NODE_ENV_KEY = "RLINF_NODE_ENV"
#: how path-like variables of a node group's ``env_vars`` merge with the node's (RLinf's name)
MERGE_MODE_ENV = "RLINF_PATH_ENV_MERGE_MODE"
APPEND = "append"
OVERRIDE = "override"
MERGE_MODES = (APPEND, OVERRIDE)
#: variables that hold a list of paths (RLinf's ``Cluster.PATH_LIKE_ENV_VARS``)
PATH_LIKE_ENV_VARS = frozenset(
    {"PYTHONPATH", "LD_LIBRARY_PATH", "PATH", "LIBRARY_PATH", "CMAKE_PREFIX_PATH", "PKG_CONFIG_PATH", "CPATH"}
)

log = logging.getLogger("rlinf.scheduler")


@dataclass(frozen=True)
class NodeEnv:
    """What the node groups' ``env_configs`` give one node.

    Args:
        env_vars: variables set in the node's workers (path-like ones merged, see the module docstring).
        python_interpreter_path: the interpreter the node's workers must run, or None (the launcher's own).
        groups: labels of the node groups these came from (for messages).
    """

    env_vars: dict = field(default_factory=dict)
    python_interpreter_path: Optional[str] = None
    groups: tuple = ()

    def to_json(self) -> str:
        """The JSON text stored under ``NODE_ENV_KEY`` in a worker spec's environment."""
        return json.dumps({"env_vars": self.env_vars, "python_interpreter_path": self.python_interpreter_path,
                           "groups": list(self.groups)})

    @staticmethod
    def from_json(text: str) -> "NodeEnv":
        """The ``NodeEnv`` that ``to_json`` wrote.

        Raises:
            ValueError: ``text`` is not such JSON.
        """
        try:
            data = json.loads(text)
            return NodeEnv(dict(data["env_vars"]), data["python_interpreter_path"], tuple(data["groups"]))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{NODE_ENV_KEY} does not hold a node environment: {text[:200]!r}") from exc


def for_node(config, node_rank: int, labels: Optional[Sequence[str]] = None) -> Optional[NodeEnv]:
    """The environment ``config`` (a ``ClusterConfig`` or None) gives node ``node_rank``, or None if none.

    Args:
        config: the parsed cluster config.
        node_rank: the node (cluster numbering).
        labels: only these node groups count (the placement's ``node_group_label``); None: every group.

    Raises:
        ClusterConfigError: two node groups of the node disagree on a variable or on the interpreter.
    """
    if config is None:
        return None
    env_vars: dict = {}
    setters: dict = {}  # variable -> the group that set it
    python, python_group, groups = None, None, []
    for group in config.node_groups or []:
        if labels is not None and group.label not in labels:
            continue
        if node_rank not in group.node_ranks:
            continue
        own = group.get_node_env_vars(node_rank)
        path = group.get_node_python_interpreter_path(node_rank)
        if not own and path is None:
            continue
        groups.append(group.label)
        for key, value in own.items():
            if key in env_vars and env_vars[key] != value:
                raise ClusterConfigError(
                    f"node {node_rank} is in node groups {setters[key]!r} and {group.label!r}, whose env_configs set "
                    f"{key} to {env_vars[key]!r} and {value!r}; place the workers with "
                    f"NodePlacementStrategy(..., node_group_label=...) to say which group's environment they get"
                )
            env_vars[key], setters[key] = value, group.label
        if path is not None:
            if python is not None and path != python:
                raise ClusterConfigError(
                    f"node {node_rank} is in node groups {python_group!r} and {group.label!r}, whose env_configs give "
                    f"it the Python interpreters {python!r} and {path!r}; place the workers with "
                    f"NodePlacementStrategy(..., node_group_label=...) to say which group's environment they get"
                )
            python, python_group = path, group.label
    if not groups:
        return None
    return NodeEnv(env_vars, python, tuple(groups))


def take(env: dict) -> Optional[NodeEnv]:
    """Remove ``NODE_ENV_KEY`` from a worker spec's ``env`` and return its ``NodeEnv`` (None if absent)."""
    text = env.pop(NODE_ENV_KEY, None)
    return None if text is None else NodeEnv.from_json(text)


def peek(env: Mapping) -> Optional[NodeEnv]:
    """The ``NodeEnv`` a worker spec's ``env`` carries (None if none), leaving ``env`` as it is."""
    text = env.get(NODE_ENV_KEY)
    return None if text is None else NodeEnv.from_json(text)


def merge_mode(*envs: Mapping) -> str:
    """``RLINF_PATH_ENV_MERGE_MODE`` from the first of ``envs`` that sets it: ``append`` or ``override``.

    Unset means ``append``; any other value logs an error and means ``append`` (as in RLinf).
    """
    for env in envs:
        value = env.get(MERGE_MODE_ENV)
        if value is None:
            continue
        mode = str(value).strip().lower()
        if mode in MERGE_MODES:
            return mode
        log.error("Invalid %s=%s. Expected one of %s. Falling back to append.", MERGE_MODE_ENV, value,
                  list(MERGE_MODES))
        return APPEND
    return APPEND


def split_paths(value: Optional[str]) -> list[str]:
    """The non-empty entries of a path list (``os.pathsep``-separated)."""
    return [p for p in (value or "").split(os.pathsep) if p]


def merge_value(key: str, existing: Optional[str], incoming: str, mode: str) -> str:
    """The value of ``key`` once ``incoming`` (a node group's) meets ``existing`` (the node's; None: unset).

    Path-like variables in ``append`` mode: ``incoming``'s entries, then ``existing``'s, each once.
    Everything else: ``incoming``.
    """
    if key not in PATH_LIKE_ENV_VARS or existing is None or mode != APPEND:
        return incoming
    entries = []
    for entry in split_paths(incoming) + split_paths(existing):
        if entry not in entries:
            entries.append(entry)
    return os.pathsep.join(entries)


def merged(node_env: NodeEnv, existing: Mapping, mode: str) -> dict:
    """``node_env``'s variables as they become on a node whose environment is ``existing``."""
    return {key: merge_value(key, existing.get(key), value, mode) for key, value in node_env.env_vars.items()}


__all__ = [
    "APPEND",
    "MERGE_MODES",
    "MERGE_MODE_ENV",
    "NODE_ENV_KEY",
    "NodeEnv",
    "OVERRIDE",
    "PATH_LIKE_ENV_VARS",
    "for_node",
    "merge_mode",
    "merge_value",
    "merged",
    "peek",
    "split_paths",
    "take",
]
