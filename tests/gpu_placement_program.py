"""Runs in its own interpreter: a Ray cluster of two simulated nodes advertising 4 GPUs each (no GPU needed).

With ``--with-multinode`` the same cluster also runs ``multinode_program.checks``
(placement, p2p and a channel across nodes, which use no GPU), so the suite
starts one two-node cluster for both; each part prints its own verdict.
"""

import os
import sys

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # Ray refuses to advertise more GPUs than a set list names

from rlinf.scheduler import (
    Cluster,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Worker,
)


class Seen(Worker):
    def __init__(self):
        super().__init__()

    def seen(self):
        from rlinf.scheduler.plugins import accelerator

        info = self.worker_info
        return dict(
            visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
            local_rank=int(os.environ["LOCAL_RANK"]),
            node=info.node_id,
            gpu_id=info.gpu_id,
            available=list(info.available_gpus),
            kind=accelerator.current().name,
            torch_type=accelerator.current().torch_device_type,
            # RLinf's class attributes: the accelerator's, None without one
            rlinf_types=(Worker.torch_device_type, getattr(Worker.torch_platform, "__name__", None),
                         Worker.accelerator_type, self.has_accelerator),
        )


def check(cluster, strategy, expected, per_process=1):
    """``expected``: per rank, (node rank, node-local devices of that rank)."""
    group = Seen.create_group().launch(cluster, placement_strategy=strategy, name=f"seen{abs(hash(repr(strategy)))}")
    try:
        got = group.seen().wait()
    finally:
        group.stop()
    covered = set()
    for rank, (g, (node, devices)) in enumerate(zip(got, expected)):
        assert g["node"] == node, (strategy, rank, g)
        if not devices:
            assert g["gpu_id"] is None and g["available"] == [] and g["kind"] == "cpu", (strategy, rank, g)
            assert list(g["rlinf_types"]) == [None, None, "NO_ACCEL", False], (strategy, rank, g)
            continue
        visible = [int(d) for d in g["visible"].split(",")]
        # the seed's torch.cuda.set_device(LOCAL_RANK) selects the worker's own first device
        assert visible[g["local_rank"]] == devices[0], (strategy, rank, g)
        assert g["gpu_id"] == g["local_rank"], (strategy, rank, g)
        assert [visible[i] for i in g["available"]] == list(devices), (strategy, rank, g)
        assert g["kind"] == "nvidia" and g["torch_type"] == "cuda", g
        assert list(g["rlinf_types"]) == ["cuda", "torch.cuda", "NV_GPU", True], g
        covered.update((node, d) for d in devices)
    assert len(got) == len(expected), (strategy, got)
    print("ok", strategy, [(g["visible"], g["local_rank"]) for g in got], flush=True)
    return covered


def placement_checks(cluster):
    assert [n.num_gpus for n in cluster.nodes] == [4, 4], cluster.nodes
    assert [n.accelerator for n in cluster.nodes] == ["nvidia", "nvidia"], cluster.nodes
    every = [(n, (d,)) for n in (0, 1) for d in range(4)]
    covered = check(cluster, PackedPlacementStrategy(0, 7), every)
    assert covered == {(n, d[0]) for n, d in every}, covered
    check(cluster, PackedPlacementStrategy(2, 5), [(0, (2,)), (0, (3,)), (1, (0,)), (1, (1,))])
    check(cluster, PackedPlacementStrategy(0, 7, num_hardware_per_process=2, stride=2),
          [(0, (0, 2)), (0, (1, 3)), (1, (0, 2)), (1, (1, 3))])
    check(cluster, FlexiblePlacementStrategy([[3], [1], [4, 5], [7]]), [(0, (3,)), (0, (1,)), (1, (0, 1)), (1, (3,))])
    check(cluster, NodePlacementStrategy([0, 1, 1]), [(0, ()), (1, ()), (1, ())])


def _part(verdict: str, fn, *args) -> bool:
    """Run one part; print ``<verdict> OK`` or ``<verdict> FAILED`` with the traceback."""
    import traceback

    try:
        fn(*args)
    except BaseException:
        print(f"{verdict} FAILED\n{traceback.format_exc()}", flush=True)
        return False
    print(f"{verdict} OK", flush=True)
    return True


def main():
    import ray
    from ray.cluster_utils import Cluster as RayTestCluster

    rc = RayTestCluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 4})
    rc.add_node(num_cpus=1, num_gpus=4)
    rc.wait_for_nodes()
    os.environ["RAY_ADDRESS"] = rc.address  # Cluster() joins the running cluster named here
    cluster = Cluster(num_nodes=2)
    ok = _part("GPU PLACEMENT", placement_checks, cluster)
    if "--with-multinode" in sys.argv[1:]:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import multinode_program

        ok = _part("MULTINODE", multinode_program.checks, cluster) and ok
    ray.shutdown()
    rc.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
