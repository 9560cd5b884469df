"""Ray's loopback switch is ours only while the cluster is on loopback.

A driver that ran an embedded cluster (switch off, so Ray takes loopback for
this node) and then, after ``ray.shutdown()``, joins a cluster that spans
machines must give Ray its own address again: the switch goes back to what the
user's environment had.  Run in a user's environment (none of hatch.toml's
variables), in a process of its own, so the suite's Ray is not touched.
"""

import subprocess
import sys

from user_env import user_env

PROGRAM = r"""
import os
from rlinf.ray import loopback, launcher
launcher._prepare_environment(None)  # an embedded cluster: loopback
import ray._private.ray_constants as c
assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and c.ENABLE_RAY_CLUSTER is False
launcher._prepare_environment("192.0.2.10:6379")  # then a cluster across machines: the user's setting again
assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in os.environ, os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
assert c.ENABLE_RAY_CLUSTER is True
launcher._prepare_environment("127.0.0.1:6379")
assert c.ENABLE_RAY_CLUSTER is False
print("OK")
"""


def test_the_switch_goes_back_when_a_later_cluster_spans_machines():
    proc = subprocess.run([sys.executable, "-c", PROGRAM], env=user_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stdout + proc.stderr
