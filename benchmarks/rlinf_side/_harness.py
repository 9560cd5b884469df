"""What every script in this folder shares: its arguments, RLinf's cluster on loopback, its answer.

These scripts run inside the RLinf 0.3.0 virtual environment that
``benchmarks/rlinf_baseline.py`` builds, never in the project's own (both
packages are the ``rlinf`` namespace).  Each is started as
``python <script>.py '<json args>'`` and prints its result as JSON on its last
line of standard output.
"""

from __future__ import annotations

import json
import os
import sys
import time


def args() -> dict:
    """The script's arguments: the JSON object given as its first command-line argument (``{}`` without one)."""
    return json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}


def _pin_ray_init(temp_dir: str) -> None:
    """Make RLinf's own ``ray.init`` calls start a private Ray on loopback in ``temp_dir``.

    RLinf's ``Cluster(num_nodes=1)`` first tries ``ray.init(address="auto")``,
    which joins any Ray cluster it finds running on the machine; on a machine
    that other programs share it could join theirs.  Here that attempt fails
    as it does on an idle machine, and RLinf then starts its own Ray, in the
    given temp dir and on 127.0.0.1, with the rest of its arguments unchanged.
    """
    import ray

    real_init = ray.init

    def init(*a, **kw):
        if kw.get("address") == "auto" or (a and a[0] == "auto"):
            raise ConnectionError("no Ray cluster to join: the benchmark starts its own")
        kw.setdefault("_temp_dir", temp_dir)
        kw.setdefault("_node_ip_address", "127.0.0.1")
        kw.setdefault("include_dashboard", False)
        return real_init(*a, **kw)

    ray.init = init


def cluster():
    """RLinf's ``Cluster(num_nodes=1)`` on a private loopback Ray (temp dir from ``RLINF_BENCH_RAY_TMP``).

    Raises:
        KeyError: ``RLINF_BENCH_RAY_TMP`` is not set (the runner sets it).
    """
    _pin_ray_init(os.environ["RLINF_BENCH_RAY_TMP"])
    from rlinf.scheduler import Cluster

    return Cluster(num_nodes=1)


def emit(result: dict) -> None:
    """Print ``result`` as JSON on one line, the last one the runner reads."""
    sys.stdout.flush()
    print(json.dumps(result), flush=True)


def shutdown() -> None:
    """Stop the Ray this process started (the runner also kills the process group afterwards)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def timed(fn) -> float:
    """Seconds ``fn()`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
