"""Drivers that join a ``ray start`` cluster (RAY_ADDRESS), run as their own processes by the tests.

    python cluster_program.py SCENARIO

Each scenario prints ``<SCENARIO> OK`` at the end (plus ``KEY=value`` lines the
test reads); any failure is an uncaught exception and a non-zero exit.
"""

import os
import sys
import time

from rlinf.scheduler import Cluster, Worker
from rlinf.scheduler.base.errors import GroupNameError


class Holder(Worker):
    def __init__(self):
        super().__init__()

    def devices(self):
        """This worker's own device: entry LOCAL_RANK of the group's visible list (see rlinf.scheduler.plugins.accelerator)."""
        return os.environ["CUDA_VISIBLE_DEVICES"].split(",")[int(os.environ["LOCAL_RANK"])]

    def pid(self):
        return os.getpid()

    def cluster_view(self):
        c = Cluster()
        return c.launcher_name, c.num_nodes, [n.ip for n in c.nodes], c.cluster_cfg


def _pg_states():
    from ray.util import placement_group_table

    return sorted(v["state"] for v in placement_group_table().values())


def gpus():
    """Stopping a group frees its GPUs at once; a relaunch under the same name gets them."""
    cluster = Cluster()
    assert cluster.num_accelerators == 4, cluster
    first = Holder.create_group().launch(cluster, name="holder")  # one worker per GPU: all 4
    assert sorted(first.devices().wait()) == ["0", "1", "2", "3"]
    first.stop()
    start = time.monotonic()
    second = Holder.create_group().launch(cluster, name="holder", timeout=60)
    print(f"RELAUNCH_S={time.monotonic() - start:.2f}")
    assert sorted(second.devices().wait()) == ["0", "1", "2", "3"]
    second.stop()
    states = _pg_states()
    assert set(states) == {"REMOVED"}, states
    # a group left running is stopped, and its GPUs freed, by shutdown
    Holder.create_group().launch(cluster, name="holder")
    cluster.shutdown()
    import ray

    if not ray.is_initialized():
        ray.init(address=os.environ["RAY_ADDRESS"])
    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU", 0) < 4 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("GPU", 0) == 4, ray.available_resources()
    print("gpus OK")


def nodes():
    """Cluster(num_nodes=2) waits for the second node; node info; Cluster() in a worker; cluster_cfg."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({
        "num_nodes": 2,
        "component_placement": {"actor": "0-1", "rollout": "all"},
        "node_groups": [{"label": "cpu", "node_ranks": "0-1", "env_configs": [{"node_ranks": "1", "env_vars": [{"X": "1"}]}]}],
    })
    try:
        Cluster(num_nodes=1, cluster_cfg=cfg)
        raise AssertionError("num_nodes that contradicts cluster_cfg accepted")
    except ValueError as exc:
        assert "cluster_cfg.num_nodes=2" in str(exc), exc
    cluster = Cluster(cluster_cfg=cfg)  # waits until the test adds the second node
    assert cluster.num_nodes == 2, cluster
    assert cluster.component_placement == {"actor": "0-1", "rollout": "all"}
    assert cluster.get_node_group("cpu")["env_configs"][0]["env_vars"] == [{"X": "1"}]
    assert cluster.get_node_group("gpu") is None
    assert [cluster.get_node_info(i).node_rank for i in range(2)] == [0, 1]
    import ray

    ray_ips = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    assert [cluster.get_node_ip(i) for i in range(2)] == [ray_ips[cluster.get_node_info(i).node_id] for i in range(2)]
    try:
        cluster.get_node_info(2)
        raise AssertionError("node rank 2 accepted")
    except ValueError:
        pass
    again = Cluster()  # the same cluster: the first explicit choice holds
    assert again.num_nodes == 2 and again.cluster_cfg == cluster.cluster_cfg
    group = Holder.create_group().launch(cluster, name="viewer")
    assert group.cluster_view().wait() == [("ray", 2, [n.ip for n in cluster.nodes], cluster.cluster_cfg)]
    start = time.monotonic()
    try:
        Cluster(num_nodes=3, node_wait_timeout=0.5)  # briefly: what counts is that the wait ends, and says why
        raise AssertionError("3 nodes accepted")
    except TimeoutError as exc:
        assert "only 2 node(s) joined" in str(exc), exc
    assert time.monotonic() - start < 60
    # the cluster shut down inside a trace block: the group's events are taken before, nobody is asked
    # after (no note), and the group then says it ended with the cluster
    import json
    import tempfile

    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    with cluster.trace(path):
        group.pid().wait()
        pending = group.pid()  # waited for after the shutdown: an answer, or the worker reported gone
        cluster.shutdown()
    with open(path) as f:
        trace = json.load(f)
    assert "pid" in {e["name"] for e in trace["traceEvents"]}, trace["otherData"]
    assert not trace["otherData"]["rlinf"]["notes"], trace["otherData"]["rlinf"]["notes"]
    try:
        group.pid()
        raise AssertionError("a group of a cluster that was shut down took a call")
    except RuntimeError as exc:
        assert "not launched any more: it was ended by cluster.shutdown()" in str(exc), exc
    group.stop()  # nothing left to stop: a no-op
    from rlinf.scheduler.base.errors import WorkerError

    try:  # not an AttributeError of a group whose session is gone
        answered = pending.wait(timeout=30)
        assert len(answered) == 1 and isinstance(answered[0], int), answered
    except WorkerError:
        pass
    print("nodes OK")


def orphan():
    """Launch a group, drop it, print its worker's pid and exit without shutdown (or sleep to be killed)."""
    cluster = Cluster()
    Holder.create_group().launch(cluster, name="orphan")  # the handle is dropped at once
    import gc

    gc.collect()
    time.sleep(1)
    from rlinf.scheduler import WorkerGroup

    group = WorkerGroup.from_group_name(Holder, "orphan")
    print(f"WORKER_PID={group.pid().wait()[0]}", flush=True)
    try:
        WorkerGroup.from_group_name(Holder, "no_such_group")
        raise AssertionError("attached to a group that does not exist")
    except GroupNameError:
        pass
    if sys.argv[2:] == ["hold"]:
        print("HOLDING", flush=True)
        time.sleep(300)
    print("orphan OK", flush=True)


if __name__ == "__main__":
    {"gpus": gpus, "nodes": nodes, "orphan": orphan}[sys.argv[1]]()
