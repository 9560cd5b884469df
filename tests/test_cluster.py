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

own_ray_cluster = pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts its own Ray clusters")
embedded_ray = pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="expects the suite's embedded Ray cluster")

PROGRAM = os.path.join(os.path.dirname(__file__), "cluster_program.py")


@own_ray_cluster
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


# -- on the suite's embedded cluster ----------------------------------------------------------------
from rlinf.scheduler import Cluster, Worker  # noqa: E402


class Viewer(Worker):
    def __init__(self):
        super().__init__()

    def view(self):
        c = Cluster()
        return c.launcher_name, c.num_nodes, [n.node_id for n in c.nodes]


@embedded_ray
def test_too_many_nodes_on_an_embedded_cluster_fails_at_once(cluster):
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"num_nodes=2.*has 1 node\(s\), and no node can join") as info:
        Cluster(num_nodes=2)
    # and how to get more nodes: a Ray cluster joined with RAY_ADDRESS, or an MPI job
    assert "ray start --head" in str(info.value) and "RAY_ADDRESS=" in str(info.value) and "rlinf.mpi" in str(info.value)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("cfg, error", [
    ({"num_nodes": 0}, ValueError),
    ({"component_placement": {"actor": "all"}}, ValueError),  # num_nodes missing
    ({"num_nodes": 1, "node_groups": [{"node_ranks": "0"}]}, ValueError),  # a group without a label
    ({"num_nodes": 1, "node_groups": [{"label": "a"}, {"label": "a"}]}, ValueError),
    ({"num_nodes": 1, "component_placement": ["actor"]}, ValueError),
    ([("num_nodes", 1)], TypeError),
])
def test_bad_cluster_cfg_is_refused_before_connecting(cfg, error):
    with pytest.raises(error, match="cluster_cfg"):
        Cluster(cluster_cfg=cfg)


@embedded_ray
def test_node_info_and_the_cluster_seen_from_a_worker(cluster, launch):
    node = cluster.get_node_info(0)
    assert node.node_rank == 0 and cluster.get_node_ip(0) == node.ip
    with pytest.raises(ValueError, match="invalid node rank"):
        cluster.get_node_info(cluster.num_nodes)
    group = launch(Viewer)
    assert group.view().wait() == [(cluster.launcher_name, cluster.num_nodes, [n.node_id for n in cluster.nodes])]
