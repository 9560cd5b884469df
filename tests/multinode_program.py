"""Runs in its own interpreter: a simulated 2-node Ray cluster on this machine."""

import os
import sys

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import ray
from ray.cluster_utils import Cluster as RayTestCluster

from rlinf.scheduler import Cluster, NodePlacementStrategy, PlacementError, Worker


class Where(Worker):
    def __init__(self):
        super().__init__()

    def where(self):
        info = self.worker_info
        return info.node_id, info.node_ip, ray.get_runtime_context().get_node_id(), os.environ["NODE_RANK"], os.environ["LOCAL_RANK"]

    def ping_peer(self, peer_rank):
        if self._rank == 0:
            self.send({"hello": self._rank}, self.worker_group_name, peer_rank)
            return self.recv(self.worker_group_name, peer_rank)
        msg = self.recv(self.worker_group_name, 0)
        self.send({"reply": msg}, self.worker_group_name, 0)
        return msg


def checks(cluster):
    """Placement, p2p and a channel across the two nodes of ``cluster`` (the driver's, joined already)."""
    assert ray.is_initialized() and len(ray.nodes()) == 2
    assert cluster.num_nodes == 2, cluster
    ray_ids = [n.node_id for n in cluster.nodes]
    group = Where.create_group().launch(cluster, placement_strategy=NodePlacementStrategy([0, 1, 1]), name="where")
    got = group.where().wait()
    assert [g[0] for g in got] == [0, 1, 1], got
    assert [g[2] for g in got] == [ray_ids[0], ray_ids[1], ray_ids[1]], (got, ray_ids)
    assert [g[3] for g in got] == ["0", "1", "1"] and [g[4] for g in got] == ["0", "0", "1"], got
    assert all(g[1] == cluster.nodes[g[0]].ip for g in got)
    assert [i.node_id for i in group.worker_info_list] == [0, 1, 1]
    # point-to-point between workers on different nodes
    res = group.execute_on(0, 1).ping_peer(1).wait()
    assert res == [{"reply": {"hello": 0}}, {"hello": 0}], res
    # a channel hosted on the node asked for, used across nodes
    from rlinf.scheduler import Channel

    ch = Channel.create("remote_queue", node_id=1)
    host = cluster.session.lookup_group("Channel.remote_queue").workers[0].info
    assert host.node_id == 1, host
    ch.put({"x": 1})
    assert ch.get() == {"x": 1}
    try:
        Channel.create("nowhere", node_id=5)
        raise AssertionError("channel on a missing node accepted")
    except PlacementError:
        pass
    try:
        Where.create_group().launch(cluster, placement_strategy=NodePlacementStrategy([2]), name="nope")
        raise AssertionError("placement on a missing node was accepted")
    except PlacementError:
        pass
    try:
        Cluster(num_nodes=3, node_wait_timeout=0.5)  # waits (briefly: only the bound matters) for a third node that never joins
        raise AssertionError("3 nodes accepted")
    except TimeoutError:
        pass
    group.stop()


def main(temp_dir):
    rc = RayTestCluster(initialize_head=True, head_node_args={"num_cpus": 1})
    rc.add_node(num_cpus=1)
    rc.wait_for_nodes()
    os.environ["RAY_ADDRESS"] = rc.address  # Cluster() joins the running cluster named here
    checks(Cluster(num_nodes=2))
    ray.shutdown()
    rc.shutdown()
    print("MULTINODE OK")


if __name__ == "__main__":
    main(sys.argv[1])
