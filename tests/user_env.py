"""The environment of a user's shell, for tests of the commands a user runs.

``hatch run`` (and CI, ``.ci/run``) sets ``hatch.toml``'s env-vars for every
command of the suite; a user who installed the packages with pip has none of
them, so what they hide (Ray's client rewriting a loopback address, say) never
shows in a test that hands its own environment on.  ``user_env()`` is this
process's environment without them, without what ``hatch run`` itself adds
(``HATCH_*``), and without what the suite's fixtures and its driver set for
their own use (the embedded cluster's token and address, the cluster secret):
only what a user's shell with the project's virtual environment on ``PATH``
would hold, plus what the test passes.
"""

from __future__ import annotations

import os
import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the project runs on 3.11, this keeps the helper importable elsewhere
    tomllib = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: set by tests/conftest.py or by the suite's driver (``Cluster()``), never by a user's shell
SUITE_VARS = ("RAY_DEDUP_LOGS", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_MODE", "RAY_COLOR_PREFIX",
              "RLINF_CLUSTER_SECRET", "RLINF_TEST_LAUNCHER", "RLINF_LAUNCHER", "PYTEST_CURRENT_TEST")


def hatch_env_vars() -> list[str]:
    """The names in ``hatch.toml``'s ``[envs.default.env-vars]`` (and the ones it always had, if the
    file cannot be read here)."""
    known = ["PYTHONDONTWRITEBYTECODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_USAGE_STATS_ENABLED",
             "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES"]
    if tomllib is None:
        return known
    with open(os.path.join(ROOT, "hatch.toml"), "rb") as f:
        declared = tomllib.load(f)["envs"]["default"].get("env-vars", {})
    return sorted(set(known) | set(declared))


def user_env(**extra: str) -> dict:
    """This process's environment as a user's shell would hold it (see the module), updated with ``extra``."""
    drop = set(hatch_env_vars()) | set(SUITE_VARS)
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("HATCH_")}
    bin_dir = os.path.dirname(sys.executable)  # the virtual environment a user would have activated
    if bin_dir not in env.get("PATH", "").split(os.pathsep):
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env
