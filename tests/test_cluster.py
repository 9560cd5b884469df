"""``Cluster`` on real multi-node Ray clusters (``ray start`` head + nodes on this machine).

Each test starts its own cluster (tests/ray_nodes.py) and runs a driver
program (tests/cluster_program.py) that joins it through RAY_ADDRESS.
"""

import os
import threading
import time

import pytest

from launcher_marks import TEST_LAUNCHER
from ray_nodes import RayNodes

pytestmark = pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts its own Ray clusters")

PROGRAM = os.path.join(os.path.dirname(__file__), "cluster_program.py")


@pytest.mark.timeout(240)
def test_cluster_waits_for_nodes_then_uses_them():
    import subprocess
    import sys

    with RayNodes(multi_node=True) as nodes:
        nodes.start_head(num_cpus=2)
        env = dict(nodes.env, RAY_ADDRESS=nodes.address, RLINF_NODE_WAIT_TIMEOUT="100")
        driver = subprocess.Popen([sys.executable, PROGRAM, "nodes"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env, start_new_session=True)
        err_lines: list[str] = []
        waiting = threading.Event()

        def read_err():
            for line in driver.stderr:
                err_lines.append(line)
                if "waiting for 2 node(s)" in line:
                    waiting.set()

        reader = threading.Thread(target=read_err, daemon=True)
        reader.start()
        try:
            # the driver says what it waits for, and keeps waiting, until the second node joins
            assert waiting.wait(120), "".join(err_lines)[-3000:] + nodes.logs()
            assert driver.poll() is None
            nodes.add_node(num_cpus=1)
            out = driver.stdout.read()
            driver.wait(150)
        finally:
            if driver.poll() is None:
                os.killpg(driver.pid, 9)
                driver.wait(30)
        reader.join(10)
        assert "nodes OK" in out, out[-3000:] + "".join(err_lines)[-5000:] + nodes.logs()
