"""Failures say who failed, where and why; bad input fails before anything starts."""

import os
import signal
import sys
import textwrap
import time

import pytest

from rlinf.scheduler import (
    GroupNameError,
    LaunchError,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementError,
    Worker,
    WorkerDiedError,
    WorkerMethodError,
)

from launcher_marks import ray_launcher_records, survives_worker_death


class Faulty(Worker):
    def __init__(self):
        super().__init__()

    def fail_on(self, rank):
        if self._rank == rank:
            raise ValueError(f"bad value on rank {self._rank}")
        return self._rank

    def pid(self):
        return os.getpid()

    def exit_with(self, code):
        os._exit(code)

    def actor_and_node(self):
        import ray

        return ray.get_runtime_context().get_actor_id(), self.worker_info.node_ip

    def fork_a_child_that_exits(self, code):
        """A child forked from the worker (as a DataLoader's) that ends with os._exit: its pid and node IP."""
        import multiprocessing

        child = multiprocessing.get_context("fork").Process(target=os._exit, args=(code,))
        child.start()
        child.join(30)
        return child.pid, child.exitcode, self.worker_info.node_ip

    def sleep(self, seconds, started=None):
        if started is not None:  # a file each rank creates once the call runs (a test kills it only then)
            open(f"{started}.{self._rank}", "w").close()
        time.sleep(seconds)
        return self._rank

    def _hidden(self):
        return 1


def test_method_error_names_group_rank_node_method_with_traceback(launch):
    group = launch(Faulty, placement=NodePlacementStrategy([0, 0, 0]), name="faulty")
    with pytest.raises(WorkerMethodError) as info:
        group.fail_on(1).wait()
    err = info.value
    assert (err.group, err.rank, err.node, err.method) == ("faulty", 1, 0, "fail_on")
    text = str(err)
    assert "group 'faulty'" in text and "rank 1" in text and "node 0" in text and "'fail_on'" in text
    assert "bad value on rank 1" in text and 'raise ValueError(f"bad value' in err.remote_traceback
    assert isinstance(err.__cause__, ValueError)
    # the driver and the group are fine afterwards
    assert group.fail_on(99).wait() == [0, 1, 2]


def _until_started(started, rank):
    end = time.monotonic() + 30
    while not os.path.exists(f"{started}.{rank}"):
        assert time.monotonic() < end, "the call never started"
        time.sleep(0.05)


@survives_worker_death
def test_killed_worker_raises_within_seconds(launch, tmp_path):
    group = launch(Faulty, placement=NodePlacementStrategy([0, 0]), name="killed")
    pids = group.pid().wait()
    handle = group.sleep(30, str(tmp_path / "started"))
    _until_started(tmp_path / "started", 1)
    os.kill(pids[1], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        handle.wait(timeout=25)
    assert time.monotonic() - start < 10
    assert info.value.rank == 1 and info.value.group == "killed" and info.value.method == "sleep"
    assert "rank 1" in str(info.value)


@survives_worker_death
def test_a_worker_that_exited_says_how_and_a_later_call_says_it_was_dead_already(launch, caplog):
    """os._exit(3) in a call: the error gives the exit code; the next call is not said to have killed it."""
    group = launch(Faulty, placement=NodePlacementStrategy([0]), name="exits")
    with pytest.raises(WorkerDiedError) as info:
        group.exit_with(3).wait(timeout=60)
    first = str(info.value)
    assert "method 'exit_with' on group 'exits' rank 0" in first and "it exited with code 3" in first, first
    assert "the worker process died at " in first, first
    with caplog.at_level("WARNING", logger="rlinf.watch"), pytest.raises(WorkerDiedError) as info:
        group.sleep(30).wait(timeout=60)
    later = str(info.value)
    assert "was already dead when 'sleep' was called: it died at " in later, later
    assert "while running 'exit_with' (it exited with code 3" in later, later
    assert not any("died while running 'sleep'" in r.getMessage() for r in caplog.records), caplog.text


@ray_launcher_records
def test_a_child_forked_from_a_worker_exits_as_it_would_and_records_nothing(launch):
    """Only the worker's own os._exit records its code: a forked child shares the patched function, and must
    neither make a cluster request from the copied connection nor leave a record a pid reuse could inherit."""
    from rlinf.ray import exits

    group = launch(Faulty, placement=NodePlacementStrategy([0]), name="forks")
    pid, code, ip = group.fork_a_child_that_exits(7).wait(timeout=60)[0]
    assert code == 7
    assert exits.exit_of(ip, pid) is None
    actor_id, _ip = group.actor_and_node().wait(timeout=60)[0]
    assert exits.exit_of(None, None, actor_id) is None  # nor under the worker's own id, which the child shares


@ray_launcher_records
@survives_worker_death
def test_a_worker_killed_by_a_signal_never_inherits_an_exit_code_recorded_under_its_pid(launch, tmp_path):
    """An earlier process with the same pid on the node left a code: a worker killed by a signal is still
    said to have been killed, not to have exited with that code."""
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put

    group = launch(Faulty, placement=NodePlacementStrategy([0]), name="reused")
    pid = group.pid().wait(timeout=60)[0]
    _actor_id, ip = group.actor_and_node().wait(timeout=60)[0]
    stale = f"{ip}:{pid}".encode()  # where a record of a process by node and pid would be
    _internal_kv_put(stale, b"9", overwrite=True, namespace="rlinf_exits")
    try:
        handle = group.sleep(30, str(tmp_path / "started"))
        _until_started(tmp_path / "started", 0)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as info:
            handle.wait(timeout=25)
    finally:
        _internal_kv_del(stale, namespace="rlinf_exits")
    text = str(info.value)
    assert "killed by a signal" in text and "exited with code 9" not in text, text


def test_wait_timeout_names_the_running_ranks(launch):
    group = launch(Faulty, placement=NodePlacementStrategy([0]), name="slow")
    with pytest.raises(TimeoutError, match=r"'sleep' on group 'slow'.*ranks still running: \[0\]"):
        group.sleep(3).wait(timeout=0.5)


def test_duplicate_group_name(cluster, launch):
    launch(Faulty, name="dup")
    with pytest.raises(GroupNameError, match="pass name="):
        Faulty.create_group().launch(cluster, name="dup")
    other = launch(Faulty, name="dup2")  # a free name still works
    assert other.pid().wait()


def test_name_is_free_again_after_stop(cluster):
    g = Faulty.create_group().launch(cluster, name="reuse")
    g.stop()
    g2 = Faulty.create_group().launch(cluster, name="reuse")
    try:
        assert g2.fail_on(5).wait() == [0]
    finally:
        g2.stop()


def test_private_and_unknown_methods(launch):
    group = launch(Faulty)
    with pytest.raises(AttributeError, match="private"):
        group._hidden()
    with pytest.raises(AttributeError, match="no public method 'nope'"):
        group.nope()


def test_execute_on_out_of_range(launch):
    group = launch(Faulty, placement=NodePlacementStrategy([0, 0]))
    with pytest.raises(ValueError, match="rank 2 is out of range"):
        group.execute_on(0, 2)
    with pytest.raises(ValueError):
        group.execute_on(-1)
    assert group.fail_on(9).wait() == [0, 1]  # nothing was selected by the failed call


def test_placement_beyond_the_cluster_starts_nothing(cluster):
    session = cluster.session
    with pytest.raises(PlacementError, match="node 3") as info:
        Faulty.create_group().launch(cluster, placement_strategy=NodePlacementStrategy([0, 3]), name="toolarge")
    assert "ray start --address=" in str(info.value) and "RAY_ADDRESS=" in str(info.value), info.value  # the fix
    with pytest.raises(PlacementError, match="accelerator"):
        Faulty.create_group().launch(cluster, placement_strategy=PackedPlacementStrategy(0, 1), name="toolarge")
    assert "toolarge" not in session.list_groups()


def test_constructor_error_is_a_launch_error(cluster):
    class BadInit(Worker):
        def __init__(self):
            super().__init__()
            raise RuntimeError("cannot build")

    with pytest.raises(LaunchError, match="cannot build") as info:
        BadInit.create_group().launch(cluster, placement_strategy=NodePlacementStrategy([0, 0]), name="badinit")
    assert info.value.method == "__init__" and "RuntimeError" in str(info.value)
    assert "badinit" not in cluster.session.list_groups()


def test_worker_that_cannot_import_its_module_fails_at_launch(cluster, tmp_path, monkeypatch):
    (tmp_path / "only_on_driver.py").write_text(textwrap.dedent("""
        VALUE = 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import only_on_driver

    class NeedsModule(Worker):
        def __init__(self):
            super().__init__()
            self.module = only_on_driver

    with pytest.raises(LaunchError, match="only_on_driver") as info:
        NeedsModule.create_group().launch(cluster, name="needsmodule", timeout=60)
    assert "ModuleNotFoundError" in str(info.value)
    sys.modules.pop("only_on_driver", None)


def test_unpicklable_constructor_argument_is_refused_before_launch(cluster):
    import threading

    with pytest.raises(TypeError, match="cannot send worker class"):
        Faulty.create_group(threading.Lock()).launch(cluster, name="unpicklable")
    assert "unpicklable" not in cluster.session.list_groups()


def test_argument_that_cannot_be_unpacked_in_the_worker(launch, tmp_path, monkeypatch):
    # a module only the driver can import travels by value (docs/rlinf.md); one whose
    # unpickling fails in the worker is reported as the call's error, naming it
    (tmp_path / "driver_only_type.py").write_text(textwrap.dedent(f"""
        import os

        class Thing:
            pass

        def _rebuild(driver_pid):
            if os.getpid() != driver_pid:
                raise ModuleNotFoundError("driver_only_type cannot be rebuilt here")
            return Broken()

        class Broken:
            def __reduce__(self):
                return (_rebuild, ({os.getpid()},))
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import driver_only_type

    group = launch(Faulty, placement=NodePlacementStrategy([0]), name="badarg")
    assert group.fail_on(driver_only_type.Thing()).wait(timeout=60) == [0]  # by value: it arrives
    with pytest.raises(WorkerMethodError, match="could not start in the worker") as info:
        group.fail_on(driver_only_type.Broken()).wait(timeout=60)
    assert info.value.rank == 0 and info.value.method == "fail_on" and "driver_only_type" in str(info.value)
    remote = (info.value.remote_traceback or "").splitlines()  # Ray colours its header line, and leaves
    assert not any("\x1b" in line for line in remote), remote  # carets alone where it dropped the code line
    assert all(remote[i - 1].startswith("    ") for i, line in enumerate(remote)
               if line.strip() and set(line.strip()) <= set("^~")), remote
    assert group.fail_on(3).wait() == [0]  # the worker is fine
    sys.modules.pop("driver_only_type", None)
