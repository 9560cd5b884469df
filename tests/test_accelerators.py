"""Accelerator plugins and device assignment.

Placement rules are checked on every strategy in-process; the full path
(Ray resources -> placement -> each worker's environment) runs on a real Ray
cluster of two simulated nodes on this machine that advertise 4 GPUs each
(``ray start --num-gpus=4``), with no GPU present: what is checked is what a
worker would hand to ``torch.cuda.set_device``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlinf.scheduler import FlexiblePlacementStrategy, NodePlacementStrategy, PackedPlacementStrategy
from rlinf.scheduler.plugins import accelerator
from rlinf.scheduler.plugins.placement import NodeInfo

HERE = os.path.dirname(os.path.abspath(__file__))
NODES = [NodeInfo(0, "10.0.0.1", 4), NodeInfo(1, "10.0.0.2", 4)]

STRATEGIES = [
    PackedPlacementStrategy(0, 7),
    PackedPlacementStrategy(1, 6),
    PackedPlacementStrategy(0, 7, num_hardware_per_process=2),
    PackedPlacementStrategy(0, 7, num_hardware_per_process=2, stride=2),
    PackedPlacementStrategy(4, 7, num_hardware_per_process=4),
    FlexiblePlacementStrategy([[3], [0, 2], [5], [4]]),
    FlexiblePlacementStrategy([[7, 6], [1]]),
]


@pytest.mark.parametrize("strategy", STRATEGIES, ids=repr)
def test_local_rank_indexes_own_device(strategy):
    placements = strategy.get_placement(NODES)
    named = set()
    for p in placements:
        assert p.visible_gpu_ids[p.local_rank] == p.local_gpu_ids[0], p
        assert [p.visible_gpu_ids[i] for i in p.device_indices] == list(p.local_gpu_ids), p
        assert len(set(p.visible_gpu_ids)) == len(p.visible_gpu_ids), p
        named.update((p.node_rank, d) for d in p.local_gpu_ids)
        same_node = [q for q in placements if q.node_rank == p.node_rank]
        # everything visible belongs to the group on this node
        assert set(p.visible_gpu_ids) <= {d for q in same_node for d in q.local_gpu_ids}, p
    # the group covers exactly the accelerators the strategy names
    table = [(n.node_rank, i) for n in NODES for i in range(n.num_gpus)]
    wanted = {table[g] for p in placements for g in p.gpu_ids}
    assert named == wanted


def test_node_strategy_has_no_devices():
    for p in NodePlacementStrategy([0, 1, 1]).get_placement(NODES):
        assert p.visible_gpu_ids == () and p.device_indices == []


def test_builtin_kinds_and_resources(monkeypatch):
    names = [k.name for k in accelerator.kinds()]
    assert {"nvidia", "amd", "ascend"} <= set(names)
    monkeypatch.delenv(accelerator.ACCELERATOR_ENV, raising=False)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "")  # no AMD devices here, whatever the machine has
    assert accelerator.for_resources({"GPU": 4, "CPU": 8}).name == "nvidia"
    assert accelerator.for_resources({"NPU": 8}).name == "ascend"
    assert accelerator.for_resources({"CPU": 8}) is None
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "0,1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert accelerator.for_resources({"GPU": 2}).name == "amd"  # the kind with devices here wins
    monkeypatch.setenv(accelerator.ACCELERATOR_ENV, "nvidia")
    assert accelerator.for_resources({"GPU": 2}).name == "nvidia"
    monkeypatch.setenv(accelerator.ACCELERATOR_ENV, "tpu9")
    with pytest.raises(Exception, match="no accelerator named 'tpu9'"):
        accelerator.for_resources({"GPU": 2})


def test_device_env_maps_through_inherited_list():
    nv = accelerator.get("nvidia")
    assert accelerator.device_env(nv, (1, 0), None)["CUDA_VISIBLE_DEVICES"] == "1,0"
    assert accelerator.device_env(nv, (1, 0), "4,5,6")["CUDA_VISIBLE_DEVICES"] == "5,4"
    asc = accelerator.get("ascend")
    env = accelerator.device_env(asc, (2,), None)
    assert env == {"ASCEND_RT_VISIBLE_DEVICES": "2", accelerator.WORKER_ACCELERATOR_ENV: "ascend"}


def test_current_defaults_to_cpu_without_devices(monkeypatch):
    monkeypatch.delenv(accelerator.WORKER_ACCELERATOR_ENV, raising=False)
    monkeypatch.delenv(accelerator.ACCELERATOR_ENV, raising=False)
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"):
        monkeypatch.setenv(var, "")
    assert accelerator.current() is accelerator.CPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert accelerator.current().torch_device_type == "cuda"
    monkeypatch.setenv(accelerator.WORKER_ACCELERATOR_ENV, "cpu")
    assert accelerator.current().name == "cpu"


def test_cli_lists_accelerators():
    out = subprocess.run([sys.executable, "-m", "rlinf.scheduler", "plugins"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if " accelerator " in line}
    assert set(rows) >= {"nvidia", "amd", "ascend"}, out.stdout
    assert "env=CUDA_VISIBLE_DEVICES" in rows["nvidia"] and "backend=nccl" in rows["nvidia"]
    assert "env=HIP_VISIBLE_DEVICES" in rows["amd"]
    assert "ray=NPU" in rows["ascend"] and "backend=hccl" in rows["ascend"]
    # installed, but of no use on a machine without their devices: not listed as usable here
    for name in ("amd", "ascend"):
        assert " no " in rows[name] and "no such device on this machine" in rows[name], rows[name]


# -- a real Ray cluster advertising GPUs ----------------------------------------------------------
@pytest.mark.timeout(360)
def test_ray_cluster_advertising_gpus():
    """Two raylets on this machine, 4 GPUs each (``ray.cluster_utils``; shared with tests/test_multinode.py)."""
    from two_nodes import verdict

    failure = verdict("GPU PLACEMENT")
    assert not failure, failure


def test_third_party_accelerator_plugin(tmp_path):
    """An accelerator kind from a module of its own: listed, found by its Ray resource, its variable used."""
    (tmp_path / "my_xpu_plugin.py").write_text(
        "from rlinf.scheduler.plugins import AcceleratorPlugin, hookimpl\n"
        "@hookimpl\n"
        "def rlinf_register_accelerators():\n"
        "    return [AcceleratorPlugin(name='xpu', ray_resource='XPU', visible_devices_env='XPU_VISIBLE',\n"
        "                              torch_device_type='xpu', collective_backend='xccl', device_count=lambda: 0)]\n"
    )
    code = (
        "from rlinf.scheduler.plugins import accelerator as a\n"
        "k = a.for_resources({'XPU': 2, 'CPU': 4})\n"
        "env = a.device_env(k, (1, 0), None)\n"
        "print(k.name, k.torch_device_type, k.collective_backend, env['XPU_VISIBLE'])\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               RLINF_PLUGINS="xpu=my_xpu_plugin")
    # two independent interpreters: started together, each spends most of its time importing
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for argv in ([sys.executable, "-c", code], [sys.executable, "-m", "rlinf.scheduler", "plugins"])]
    try:
        (out, err), (listed, _) = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert out.split() == ["xpu", "xpu", "xccl", "1,0"], out + err
    assert any(line.startswith("xpu ") and "env=XPU_VISIBLE" in line for line in listed.splitlines()), listed
