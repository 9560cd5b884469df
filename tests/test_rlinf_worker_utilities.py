"""RLinf's worker utilities, cluster helpers and scheduler paths, used as RLinf's workers and runners use them.

``device_lock``: workers of different groups that share a device hold it one at a time, and a holder
that is killed frees it (the lock's core, given the device ids: no GPU here).  ``acquire_free_port``:
groups asking at once get distinct ports, free when handed.  The rest: names, hardware, liveness,
RLinf's env/profiling helpers on ``Cluster``, ``Tracer(path)``, and (in a program of its own, with an
embedded cluster) the extension hook, ``Cluster.allocate``, the profiler window and ``ray.shutdown()``
followed by a new ``Cluster()``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

from launcher_marks import TEST_LAUNCHER, survives_worker_death
from rlinf.scheduler import Channel, Cluster, NodePlacementStrategy, Tracer, Worker
from rlinf.scheduler.base.errors import WorkerMethodError
from rlinf.scheduler.cluster import ClusterEnvVar, PathEnvMergeMode, ProfileSettings

ray_only = pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="runs its own embedded Ray cluster")


class Holder(Worker):
    def hold(self, ids):
        from rlinf.scheduler.worker.lock import DeviceLock

        self._held = DeviceLock(self, ids)
        self._held.acquire(timeout=5)
        return os.getpid()

    def try_lock(self, ids, timeout):
        from rlinf.scheduler.worker.lock import DeviceLock

        lock = DeviceLock(self, ids)
        start = time.monotonic()
        lock.acquire(timeout=timeout)
        waited = time.monotonic() - start
        again = lock.acquire()  # RLinf: the holder acquiring again returns at once
        lock.release()
        try:
            lock.release()
        except RuntimeError as exc:
            released_twice = str(exc)
        return waited, again, released_twice

    def own_lock(self):
        """A worker without accelerators: its device lock is a no-op."""
        with self.device_lock:
            pass
        self.device_lock.release()
        return self.device_lock.accelerator_ids

    def ports(self, n):
        return [self.acquire_free_port() for _ in range(n)]

    def contested_port(self, port, fallback):
        from rlinf.scheduler.worker.lock import acquire_port

        proposals = iter([port, port, fallback])
        return acquire_port(lambda: next(proposals), 3)

    def about(self):
        return dict(name=self.get_name(), parent=self.get_parent_rank(), hw=self.hardware_type,
                    infos=self.hardware_infos, node=self._cluster_node_rank,
                    alive_self=Worker.check_worker_alive(self.get_name()),
                    alive_other=Worker.check_worker_alive("no_such_group_here:0"))


@survives_worker_death
def test_device_lock_is_held_by_one_worker_at_a_time_and_freed_when_its_holder_is_killed(launch):
    ids = [f"test-{uuid.uuid4().hex[:8]}"]  # a device id no other test uses
    holder = launch(Holder, placement=NodePlacementStrategy([0]))
    other = launch(Holder, placement=NodePlacementStrategy([0]))
    pid = holder.hold(ids).wait(timeout=30)[0]
    with pytest.raises(WorkerMethodError, match=rf"held by worker '{holder.worker_group_name}:0'"):
        other.try_lock(ids, 0.3).wait(timeout=30)
    assert Worker.check_worker_alive(f"{holder.worker_group_name}:0")
    os.kill(pid, signal.SIGKILL)
    waited, again, released_twice = other.try_lock(ids, 10).wait(timeout=30)[0]
    assert waited < 10 and again is True and "Lock is not acquired" in released_twice
    deadline = time.monotonic() + 30
    while Worker.check_worker_alive(f"{holder.worker_group_name}:0"):
        assert time.monotonic() < deadline, "a killed worker still reads as alive"
        time.sleep(0.05)


def test_device_lock_without_accelerators_is_a_no_op(launch):
    group = launch(Holder, placement=NodePlacementStrategy([0]))
    assert group.own_lock().wait(timeout=30) == [[]]


def test_device_lock_keys_are_the_node_ids_of_the_workers_own_devices(monkeypatch):
    """The ids come from the worker's visible-devices list (what its launcher set), indexed by its own devices."""
    import dataclasses

    from rlinf.scheduler.worker.lock import DeviceLock

    monkeypatch.setenv("RLINF_WORKER_ACCELERATOR", "nvidia")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")
    worker = Worker()
    worker._worker_info = dataclasses.replace(worker.worker_info, available_gpus=[2, 0])
    assert worker.accelerator_ids == ["7", "4"]
    assert DeviceLock(worker).accelerator_ids == ["4", "7"]  # taken in id order: two workers never deadlock
    assert worker.hardware_type == "Accelerator"


def test_groups_asking_for_ports_at_once_get_distinct_free_ports(launch):
    a = launch(Holder, placement=NodePlacementStrategy([0, 0]))
    b = launch(Holder, placement=NodePlacementStrategy([0, 0]))
    calls = [a.ports(3), b.ports(3)]  # all four workers ask at the same time
    ports = [p for call in calls for per_rank in call.wait(timeout=60) for p in per_rank]
    assert len(ports) == 12 and len(set(ports)) == 12, ports
    for port in ports:  # free when handed: nothing listens on it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", port))
    # the same candidate proposed to two workers: the second is refused it and takes the next one
    port, fallback = Cluster.find_free_port(), Cluster.find_free_port()
    first = a.execute_on(0).contested_port(port, fallback).wait(timeout=30)[0]
    second = b.execute_on(0).contested_port(port, fallback).wait(timeout=30)[0]
    assert (first, second) == (port, fallback)
    with pytest.raises(ValueError, match="max_port_num"):
        Worker().acquire_free_port(max_port_num=0)
    # RLinf main's max_port_num: the largest acceptable port, also below the kernel's ephemeral range
    low = Worker().acquire_free_port(max_port_num=20000)
    assert 1024 <= low <= 20000 and Cluster.find_free_port(max_port_num=65535) <= 65535


def test_names_hardware_liveness_and_group_class_name(launch):
    group = launch(Holder, placement=NodePlacementStrategy([0]))
    about = group.about().wait(timeout=30)[0]
    assert about == dict(name=f"{group.worker_group_name}:0", parent=0, hw=None, infos=[], node=0,
                         alive_self=True, alive_other=False)
    assert group.worker_cls_name == "Holder"
    assert Channel.create(f"local_{uuid.uuid4().hex[:6]}", local=True).is_local is True
    assert Channel.is_local is False


def test_cluster_helpers(cluster):
    assert Cluster.has_initialized()
    assert len(Cluster.get_alive_nodes()) >= 1
    assert cluster.accelerator_ranks == [list(range(n.num_gpus)) for n in cluster.nodes][:1] + [
        list(range(sum(m.num_gpus for m in cluster.nodes[:i]), sum(m.num_gpus for m in cluster.nodes[:i + 1])))
        for i in range(1, cluster.num_nodes)]
    assert Cluster.get_full_env_var_name(ClusterEnvVar.EXT_MODULE) == "RLINF_EXT_MODULE"
    assert Cluster.get_sys_env_var(ClusterEnvVar.COMM_NET_DEVICES, "dflt") == os.environ.get(
        "RLINF_COMM_NET_DEVICES", "dflt")
    assert Cluster.get_path_env_merge_mode({}) is PathEnvMergeMode.APPEND
    assert Cluster.get_path_env_merge_mode({"RLINF_PATH_ENV_MERGE_MODE": "Override"}) is PathEnvMergeMode.OVERRIDE
    assert Cluster.get_path_env_merge_mode({"RLINF_PATH_ENV_MERGE_MODE": "bogus"}) is PathEnvMergeMode.APPEND
    base = {"PATH": "/a:/b", "FOO": "1"}
    assert Cluster.merge_worker_env_vars(base, {"PATH": "/c:/a", "FOO": "2"}, PathEnvMergeMode.APPEND) == {
        "PATH": "/c:/a:/b", "FOO": "2"}
    assert Cluster.merge_worker_env_vars(base, {"PATH": "/c"}, "override")["PATH"] == "/c"
    assert base == {"PATH": "/a:/b", "FOO": "1"}
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", Cluster.find_free_port()))
    with pytest.raises(ValueError, match="Invalid node_id"):
        cluster.allocate(Holder, "alloc_bad:0", node_rank=cluster.num_nodes)


def test_profiling_helpers(tmp_path):
    cfg = {"backend": "nsight", "worker_groups": ["Actor"], "steps": [2], "output_dir": str(tmp_path),
           "options": {"trace": "cuda,nvtx"}, "flags": ["w"]}
    cmd = Cluster.modify_profile_context("/usr/bin/python3", "actor:1", cfg)
    assert cmd.startswith("nsys profile -w --trace=cuda,nvtx --capture-range=cudaProfilerApi --capture-range-end=stop")
    assert cmd.endswith(f"-o {tmp_path}/rlinf_profile_actor_1_%p /usr/bin/python3")
    assert Cluster.modify_profile_context("/usr/bin/python3", "rollout:0", cfg) == "/usr/bin/python3"
    assert Cluster.modify_profile_context("/usr/bin/python3", "actor:0", None) == "/usr/bin/python3"
    assert Cluster.get_profiling_env_vars_for_worker("actor:0", cfg) == {}
    rocm = {"backend": "rocprof-sys", "worker_groups": "all", "output_dir": str(tmp_path), "env": {"X": "1"}}
    assert Cluster.get_profiling_env_vars_for_worker("env:3", rocm) == {
        "ROCPROFSYS_OUTPUT_PATH": str(tmp_path), "ROCPROFSYS_OUTPUT_PREFIX": "rlinf_profile_env_3_%p", "X": "1"}
    settings = ProfileSettings.from_config(cfg)
    assert settings.should_profile_step(2) and not settings.should_profile_step(3)
    assert not ProfileSettings.from_config({**cfg, "enabled": False}).profiles_worker_group("actor")
    with pytest.raises(ValueError, match="backend"):
        ProfileSettings.from_config({"worker_groups": ["a"]})
    with pytest.raises(ValueError, match="unknown"):
        ProfileSettings.from_config({"backend": "nsight", "bogus": 1})


def test_tracer_manager_writes_rlinf_jsonl(tmp_path):
    tracer = Tracer(tmp_path / "sub" / "trace_events.jsonl")
    tracer.record({"name": "step", "ph": "B", "ts": 1.0, "pid": "actor:0", "tid": "main"})
    tracer.record({"name": "step", "ph": "E", "ts": 2.0, "pid": "actor:0", "tid": "main"})
    path = tracer.finalize()
    assert os.path.isabs(path) and path == str(tmp_path / "sub" / "trace_events.jsonl")
    assert [json.loads(line)["ph"] for line in open(path)] == ["B", "E"]
    assert tracer.finalize() == path
    with pytest.raises(RuntimeError, match="finalized"):
        tracer.record({"name": "late"})
    with pytest.raises(TypeError):
        Tracer(tmp_path / "t.jsonl").record(["not", "a", "dict"])


def test_tracer_never_appends_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    os.symlink(victim, tmp_path / "trace_events.jsonl")
    with pytest.raises(OSError):
        Tracer(tmp_path / "trace_events.jsonl")
    assert victim.read_text() == "keep me"
    tracer = Tracer(tmp_path / "fresh.jsonl")
    assert oct(os.stat(tracer.output_file).st_mode & 0o777) == oct(0o600)


PROGRAM = r"""
import json, os, ray, sys
from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

class W(Worker):
    def __init__(self):
        super().__init__()
        self.registered_before_init = os.environ.get("EXT_REGISTERED")

    def env(self, name):
        return os.environ.get(name)

    def registered(self):
        return self.registered_before_init

    def work(self):
        import torch
        return float(torch.ones(64, 64).matmul(torch.ones(64, 64)).sum())

out = sys.argv[1]
cfg = {"num_nodes": 1, "profiling": {"backend": "torch", "worker_groups": ["prof"], "steps": [1], "output_dir": out}}
cluster = Cluster(cluster_cfg=cfg, num_cpus=2)
prof = W.create_group().launch(cluster, NodePlacementStrategy([0]), name="prof")
print("EXT", prof.registered().wait(timeout=60), flush=True)
# a worker of its own, with its own variables; its group is not profiled
other = cluster.allocate(W, "alloc:0", node_rank=0, env_vars={"ALLOC_FOO": "bar", "PATH": "/alloc/bin"})
print("ALLOC", other.env("ALLOC_FOO").wait(timeout=60), other.env("PATH").wait(timeout=60)[0].split(":")[0],
      other.worker_group_name, flush=True)
prof.start_profile(0).wait(timeout=60)
print("STEP0", prof.stop_profile().wait(timeout=60), flush=True)
prof.start_profile(1).wait(timeout=60)
other.start_profile(1).wait(timeout=60)
prof.work().wait(timeout=60)
print("STEP1", json.dumps(prof.stop_profile().wait(timeout=60)), other.stop_profile().wait(timeout=60), flush=True)
for cycle in range(int(sys.argv[2])):
    ray.shutdown()
    try:
        prof.env("X").wait(timeout=10)
    except RuntimeError as exc:
        print("OLD", "not launched any more" in str(exc), flush=True)
    cluster = Cluster(num_nodes=1, num_cpus=2)
    prof = W.create_group().launch(cluster, NodePlacementStrategy([0]), name="prof")
    print("AGAIN", cycle, prof.env("RANK").wait(timeout=60), Cluster.has_initialized(), flush=True)
cluster.shutdown()
"""


@ray_only
def test_extension_hook_allocate_profiler_window_and_a_new_cluster_after_ray_shutdown(tmp_path):
    (tmp_path / "ext_mod.py").write_text("import os\n\ndef register():\n    os.environ['EXT_REGISTERED'] = 'yes'\n")
    out = tmp_path / "profiles"
    env = {**os.environ, "RLINF_EXT_MODULE": "ext_mod",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
           "RLINF_STATUS_DIR": str(tmp_path / "status")}
    env.pop("RAY_ADDRESS", None)
    # one new cluster after ray.shutdown() (each further one takes the same path: run the program with a
    # larger count to see it hold any number of times)
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(out), "1"], capture_output=True, text=True, env=env,
                          timeout=240, cwd=str(tmp_path))
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in proc.stdout.splitlines() if " " in line}
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert lines["EXT"] == "['yes']"
    assert lines["STEP0"] == "[None]"
    written, others = lines["STEP1"].split(" ", 1)
    [path] = json.loads(written)
    assert others == "[None]" and path.startswith(str(out)) and path.endswith("_step1.json")
    assert "traceEvents" in json.load(open(path))
    assert lines["ALLOC"] == "['bar'] /alloc/bin alloc"
    assert lines["OLD"] == "True"
    assert [line for line in proc.stdout.splitlines() if line.startswith("AGAIN")] == [
        "AGAIN 0 ['0'] True"]


def test_dynamic_scheduler_paths_helpers_and_a_clear_error_for_the_rest():
    from rlinf.scheduler.dynamic_scheduler.manager import RolloutScalingScheduler
    from rlinf.scheduler.dynamic_scheduler.scheduler_worker import SchedulerWorker
    from rlinf.scheduler.dynamic_scheduler.utils import (
        get_scheduler_channel, get_scheduler_request_queue, get_scheduler_response_queue, get_valid_dp_sizes)

    assert get_scheduler_channel("rollout", 2) == "dynamic_scheduler_channel_for_rollout_2"
    assert (get_scheduler_request_queue(), get_scheduler_response_queue()) == (
        "dynamic_scheduler_request_queue", "dynamic_scheduler_response_queue")
    cfg = {"algorithm": {"group_size": 4, "n_minibatches": 2}, "data": {"rollout_batch_size": 8}}
    assert get_valid_dp_sizes(cfg, total_gpus=8, model_parallel_size_with_cp=2) == [1, 2, 4]  # 16 per iteration
    with pytest.raises(AssertionError, match="divisible"):
        get_valid_dp_sizes({**cfg, "algorithm": {"group_size": 3, "n_minibatches": 5}}, 8, 1)
    for cls in (RolloutScalingScheduler, SchedulerWorker):
        with pytest.raises(NotImplementedError, match="RLinf application logic"):
            cls(None)


def test_extension_module_and_rank_config_at_rlinf_paths(tmp_path, monkeypatch):
    from rlinf.scheduler.cluster import load_user_extension_module
    from rlinf.scheduler.cluster.utils import parse_rank_config

    name = f"ext_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text("CALLS = []\n\ndef register():\n    CALLS.append(1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("RLINF_EXT_MODULE", name)
    load_user_extension_module()
    load_user_extension_module()  # once per process
    assert sys.modules[name].CALLS == [1]
    monkeypatch.setenv("RLINF_EXT_MODULE", "no_such_module_here_at_all")
    load_user_extension_module()  # logged, not raised (RLinf)
    assert parse_rank_config("0-2,5", range(8), "node") == [0, 1, 2, 5]


def test_a_released_lock_is_free_though_a_child_shares_its_descriptor():
    """A child started while the lock was held (a DataLoader worker, a pool) shares its open file: the lock is
    dropped explicitly, so releasing frees it for the next worker although the child lives on."""
    import fcntl

    from rlinf.scheduler.worker import lock

    port = Cluster.find_free_port()
    assert lock.lock_port(port)
    fd = lock._port_fds[port]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], pass_fds=[fd])
    try:
        lock._unlock_port(port)
        other = os.open(os.path.join(lock.lock_dir(), f"port-{port}.lock"), os.O_RDWR)
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError while the child holds it
        finally:
            os.close(other)
    finally:
        child.kill()
        child.wait(timeout=30)
