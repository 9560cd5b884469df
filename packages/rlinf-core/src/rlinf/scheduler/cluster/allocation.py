"""``Cluster.allocate``: one worker of a class on one node, with its own environment variables.

RLinf's group launch calls ``Cluster.allocate`` once per worker; programs
that start single workers themselves call it too.  Here it launches a group
of one worker through ``WorkerGroup.launch`` (every launcher), placed on the
node with ``NodePlacementStrategy``.  The worker's ``env_vars`` travel in
``ALLOCATED_ENV`` (the launch forwards ``RLINF_*`` settings to its workers)
and are applied in the worker, merged per ``RLINF_PATH_ENV_MERGE_MODE``,
before its class is built (``apply_allocated_env``).  Allocations take
turns; a plain ``launch`` started from another thread of the driver while one
runs would forward that variable too, so a program allocating from several
threads launches its other groups from them as well, or after.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Optional

from ..base.address import WorkerAddress
from ..plugins.placement import NodePlacementStrategy
from ..runtime.cluster_helpers import ClusterHelpers, provide_allocator
from ..runtime.group import WorkerGroup

#: the variable carrying an allocated worker's ``env_vars`` (JSON) from the launch to the worker
ALLOCATED_ENV = "RLINF_ALLOCATED_ENV"
#: a launch forwards the launching process's ``RLINF_*`` variables as they are when it starts: one at a time
_launching = threading.Lock()


@provide_allocator
def allocate(cluster, cls: type, worker_name: str, node_rank: int, max_concurrency: Optional[int], env_vars: dict,
             node_group_label: Optional[str], cls_args: tuple, cls_kwargs: dict) -> WorkerGroup:
    """Launch one worker (see ``ClusterHelpers.allocate``)."""
    if not isinstance(worker_name, str) or not worker_name:
        raise ValueError(f"worker_name must be a non-empty str, got {worker_name!r}")
    bad = [k for k, v in env_vars.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise TypeError(f"env_vars must map str to str; bad entries: {bad}")
    group_name = WorkerAddress.from_name(worker_name).root_group_name
    placement = NodePlacementStrategy(node_ranks=[node_rank], node_group_label=node_group_label)
    group = WorkerGroup(cls, cls_args, cls_kwargs)
    with _launching:
        before = os.environ.get(ALLOCATED_ENV)
        if env_vars:
            os.environ[ALLOCATED_ENV] = json.dumps(env_vars)
        else:
            os.environ.pop(ALLOCATED_ENV, None)
        try:
            return group.launch(cluster, placement, name=group_name, max_concurrency=max_concurrency)
        finally:
            if before is None:
                os.environ.pop(ALLOCATED_ENV, None)
            else:
                os.environ[ALLOCATED_ENV] = before


def apply_allocated_env() -> None:
    """In a worker: apply the ``env_vars`` it was allocated with (path-like ones merged), once."""
    raw = os.environ.pop(ALLOCATED_ENV, None)
    if not raw:
        return
    env_vars = json.loads(raw)
    mode = ClusterHelpers.get_path_env_merge_mode(os.environ)
    os.environ.update(ClusterHelpers.merge_worker_env_vars(dict(os.environ), env_vars, mode))
