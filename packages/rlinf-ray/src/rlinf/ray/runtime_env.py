"""The Ray ``runtime_env`` of a worker actor: its node groups' ``env_configs``.

A worker spec carries what the cluster config's node groups give the
worker's node (``rlinf.scheduler.plugins.node_env``).  The actor's process
is started with those variables (``env_vars``) and, when one is configured,
with that Python interpreter (``py_executable``), so that variables read when
a process starts (``LD_LIBRARY_PATH``, ``PYTHONPATH``) take effect.

Path-like variables in ``append`` mode are given as ``"<entries>:${NAME}"``,
which Ray expands to the node's own value when it starts the process (a
node without the variable sees a trailing ``:`` until the worker host
applies the same merge to the running process, which drops it).
"""

from __future__ import annotations

import os
from typing import Optional

from rlinf.scheduler.base.errors import LaunchError
from rlinf.scheduler.plugins import node_env
from rlinf.scheduler.plugins.launcher import WorkerSpec


def py_executable_supported() -> bool:
    """Whether the installed Ray knows the ``py_executable`` runtime_env field (Ray 2.10 and later)."""
    try:
        from ray.runtime_env import RuntimeEnv
    except ImportError:
        return False
    return "py_executable" in getattr(RuntimeEnv, "known_fields", ())


def worker_runtime_env(spec: WorkerSpec, local_node_id: Optional[str] = None) -> Optional[dict]:
    """The ``runtime_env`` option for the actor of ``spec``, or None when its node has no configured env.

    Args:
        spec: the worker's spec (its ``env`` may carry the node's ``NodeEnv``).
        local_node_id: the Ray node id of this process's node; a configured interpreter is checked
            for existence when the worker goes there (other nodes' files cannot be seen from here).

    Raises:
        LaunchError: an interpreter is configured but this Ray cannot set one (no ``py_executable``),
            or it does not exist on this node.
    """
    own = node_env.peek(spec.env)
    if own is None:
        return None
    mode = node_env.merge_mode(spec.env)  # the launching process's setting, forwarded with RLINF_*
    env_vars = {}
    for key, value in own.env_vars.items():
        if key in node_env.PATH_LIKE_ENV_VARS and mode == node_env.APPEND:
            value = os.pathsep.join(node_env.split_paths(value) + ["${%s}" % key])
        env_vars[key] = value
    out: dict = {"env_vars": env_vars} if env_vars else {}
    python = own.python_interpreter_path
    if python is not None:
        where = (f"node {spec.placement.node_rank}'s python_interpreter_path {python!r} "
                 f"(env_configs of node group(s) {', '.join(own.groups)})")
        if not py_executable_supported():
            import ray

            raise LaunchError(
                f"{where} cannot be used: Ray {ray.__version__} has no 'py_executable' runtime_env field "
                f"(Ray 2.10 or later has); upgrade Ray or drop python_interpreter_path",
                group=spec.group_key, rank=spec.placement.rank, node=spec.placement.node_rank, method="__init__",
            )
        if local_node_id is not None and spec.node.node_id == local_node_id and not os.access(python, os.X_OK):
            raise LaunchError(
                f"{where} is not an executable file on that node",
                group=spec.group_key, rank=spec.placement.rank, node=spec.placement.node_rank, method="__init__",
            )
        out["py_executable"] = python
    return out or None


__all__ = ["py_executable_supported", "worker_runtime_env"]
