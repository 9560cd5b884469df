"""RLinf programs run unchanged: import paths, WorkerInfo, worker methods over group
helpers, timing, broadcast forms, CollectiveGroupOptions and launch keywords, written
the way an RLinf program uses them."""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid

import pytest
import torch

from launcher_marks import TEST_LAUNCHER, survives_worker_death
from rlinf.scheduler import (
    CollectiveGroupOptions,
    NodePlacementStrategy,
    Worker,
    WorkerGroup,
)
from rlinf.scheduler.base.errors import WorkerDiedError, WorkerMethodError


def _name(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:6]}"


@pytest.fixture
def groups():
    """Groups stopped through the class (their workers may define ``stop``)."""
    launched = []
    yield launched
    for g in reversed(launched):
        WorkerGroup.stop(g)


def test_import_paths_resolve_to_the_same_objects():
    import rlinf.scheduler as sched
    from rlinf.scheduler.channel.channel import Channel
    from rlinf.scheduler.cluster import Cluster
    from rlinf.scheduler.collective import CollectiveGroupOptions as Options
    from rlinf.scheduler.placement import FlexiblePlacementStrategy, PackedPlacementStrategy
    from rlinf.scheduler.worker import Worker as PkgWorker
    from rlinf.scheduler.worker import WorkerGroup as PkgGroup
    from rlinf.scheduler.worker.worker import Worker as ModWorker
    from rlinf.scheduler.worker.worker_group import WorkerGroup as ModGroup

    assert ModWorker is PkgWorker is sched.Worker
    assert ModGroup is PkgGroup is sched.WorkerGroup
    assert Channel is sched.Channel and Cluster is sched.Cluster and Options is sched.CollectiveGroupOptions
    assert PackedPlacementStrategy is sched.PackedPlacementStrategy
    assert FlexiblePlacementStrategy is sched.FlexiblePlacementStrategy


def test_accelerator_class_attributes_in_the_driver():
    """As RLinf: without an accelerator the platform and device type are None (programs test ``is not None``)."""
    expected = "cuda" if torch.cuda.is_available() else None
    assert Worker.torch_device_type == expected
    assert Worker.torch_platform is (torch.cuda if expected else None)
    assert Worker.accelerator_type == ("NV_GPU" if expected == "cuda" else "NO_ACCEL")
    assert isinstance(Worker.logger, logging.Logger)


class InfoWorker(Worker):
    def __init__(self):
        super().__init__()

    def facts(self):
        info = self.worker_info
        return dict(
            rank=info.rank,
            node=info.cluster_node_rank,
            group_world_size=info.group_world_size,
            local_rank=info.local_rank,
            local_world_size=info.local_world_size,
            accelerators=info.available_accelerators,
            device_type=type(self).torch_device_type,
            platform=self.torch_platform,
            has_accelerator=self.has_accelerator,
            accelerator_type=Worker.accelerator_type,
        )


def test_worker_info_fields_and_accelerator_attributes_in_workers(cluster, groups):
    g = InfoWorker.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name=_name("info"))
    groups.append(g)
    facts = g.facts().wait()
    assert [f["rank"] for f in facts] == [0, 1]
    assert all(f["node"] == 0 and f["group_world_size"] == 2 and f["local_world_size"] == 2 for f in facts)
    assert [f["local_rank"] for f in facts] == [0, 1]
    assert all(f["accelerators"] == [] for f in facts)
    assert all(f["device_type"] is None and f["platform"] is None and f["accelerator_type"] == "NO_ACCEL"
               and f["has_accelerator"] is False for f in facts)


class EnvLike(Worker):
    """Defines methods named like group helpers, as RLinf env workers define ``stop``."""

    def __init__(self):
        super().__init__()
        self.stopped = False

    def stop(self):
        self.stopped = True
        return f"env {self._rank} stopped"

    def world_size(self):
        return "mine"

    def is_stopped(self):
        return self.stopped


class Plain(Worker):
    def __init__(self):
        super().__init__()

    def ping(self):
        return self._rank


def test_worker_methods_win_over_group_helpers(cluster, groups):
    g = EnvLike.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name=_name("envlike"))
    groups.append(g)
    assert g.stop().wait() == ["env 0 stopped", "env 1 stopped"]
    assert g.world_size().wait() == ["mine", "mine"]
    assert g.is_stopped().wait() == [True, True]  # the group still runs
    assert WorkerGroup.world_size.fget(g) == 2  # the helper stays reachable through the class
    WorkerGroup.stop(g)
    with pytest.raises(RuntimeError, match="not launched"):
        g.is_stopped()


def test_group_helpers_keep_their_names_when_the_worker_does_not_define_them(cluster):
    g = Plain.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name=_name("plain"))
    assert g.world_size == 2 and g.ping().wait() == [0, 1]
    g.stop()
    with pytest.raises(RuntimeError, match="not launched any more: it was stopped"):
        g.ping()


class Timed(Worker):
    def __init__(self):
        super().__init__()

    @Worker.timer()
    def generate(self):
        time.sleep(0.01)
        with self.worker_timer():  # tag: this function's name
            time.sleep(0.01)
        with self.worker_timer("inner"):
            pass
        return self._rank

    @Worker.timer
    def bare(self):
        return 1

    def popped(self):
        return self.pop_execution_time("generate"), self.pop_execution_times()

    def pop_missing(self):
        return self.pop_execution_time("never")


def test_timer_tags_default_to_the_function_name_and_pop(cluster, groups):
    g = Timed.create_group().launch(cluster, NodePlacementStrategy([0]), name=_name("timed"))
    groups.append(g)
    result = g.generate()
    assert result.wait() == [0]
    durations = result.consume_durations()
    assert set(durations) == {"generate", "inner"}
    assert durations["generate"] >= 0.02  # the decorator and the untagged block share the tag
    assert set(g.bare().consume_durations()) == {"bare"}
    (gen, rest), = g.popped().wait()
    assert gen >= 0.02 and set(rest) == {"inner", "bare"}
    with pytest.raises(WorkerMethodError, match="has not been recorded"):
        g.pop_missing().wait()


class Caster(Worker):
    def __init__(self):
        super().__init__()

    def cast(self, groups, src=None):
        payload = {"from": self._rank, "t": torch.full((3,), float(self._rank))}
        kwargs = {} if src is None else {"src": src}
        got = self.broadcast(payload, groups=groups, **kwargs)
        return got["from"], got["t"].tolist()


def test_broadcast_rank_forms_and_default_source(cluster, groups):
    name = _name("caster")
    g = Caster.create_group().launch(cluster, NodePlacementStrategy([0, 0, 0]), name=name)
    groups.append(g)
    cases = [
        ([(name, [0, 1, 2])], None, 0),  # list of ints: the first listed is the source
        ([(name, 2), (name, [0, 1])], None, 2),  # int, then a list
        ([(name, [(1,), (0,), (2,)])], None, 1),  # list of tuple rank paths
        ([(name, (0,)), (name, [1, 2])], None, 0),  # a tuple rank path
        ([(name, [0, 1, 2])], (name, 2), 2),  # explicit int source
        ([(name, [0, 1, 2])], (name, (1,)), 1),  # explicit tuple-path source
    ]
    for spec, src, expected in cases:
        got = g.cast(spec, src).wait(timeout=60)
        assert got == [(expected, [float(expected)] * 3)] * 3, (spec, src)


class OptionsWorker(Worker):
    def __init__(self):
        super().__init__()

    def exchange(self, peer_group):
        records = []
        handler = logging.Handler(logging.DEBUG)
        handler.emit = records.append
        log = logging.getLogger("rlinf.p2p")
        old = log.level
        log.addHandler(handler)
        log.setLevel(logging.DEBUG)
        try:
            opts = CollectiveGroupOptions(accel_max_ctas=4, accel_min_ctas=1, accel_cluster_size=2,
                                          is_high_priority_stream=True, use_ring_broadcast=True)
            if self._rank == 0:
                for i in range(3):
                    self.send(i, peer_group, 1, options=opts)
                got = None
            else:
                got = [self.recv(peer_group, 0, options=opts) for _ in range(3)]
        finally:
            log.removeHandler(handler)
            log.setLevel(old)
        return got, [r.getMessage() for r in records if "ignores" in r.getMessage()]


def test_collective_group_options_accepts_rlinf_fields(cluster, groups):
    name = _name("opts")
    g = OptionsWorker.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name=name)
    groups.append(g)
    (sent, notes0), (got, notes1) = g.exchange(name).wait(timeout=60)
    assert got == [0, 1, 2]
    # said once per process, however many messages carried the options
    for notes in (notes0, notes1):
        assert len(notes) <= 1
    assert len(notes0 + notes1) >= 1 and "accel_max_ctas" in (notes0 + notes1)[0]
    with pytest.raises(ValueError, match="accel_min_ctas"):
        CollectiveGroupOptions(accel_max_ctas=1, accel_min_ctas=2)


def test_launch_rejects_unknown_and_bad_keywords(cluster):
    with pytest.raises(TypeError, match="unexpected keyword"):
        Plain.create_group().launch(cluster, name=_name("bad"), num_gpus_per_worker=1)
    with pytest.raises(ValueError, match="max_concurrency"):
        Plain.create_group().launch(cluster, name=_name("bad"), max_concurrency=0)
    with pytest.raises(TypeError, match="isolate_gpu"):
        Plain.create_group().launch(cluster, name=_name("bad"), isolate_gpu="no")
    with pytest.raises(TypeError, match="catch_system_failure"):
        Plain.create_group().launch(cluster, name=_name("bad"), catch_system_failure="yes")
    assert _name("x") not in cluster.session.list_groups()


class Exiter(Worker):
    def __init__(self):
        super().__init__()

    def leave(self):
        sys.exit(3)

    def ping(self):
        return "alive"


def test_system_exit_is_reported_by_default(cluster, groups):
    g = Exiter.create_group().launch(cluster, NodePlacementStrategy([0]), name=_name("exit"))
    groups.append(g)
    with pytest.raises(WorkerMethodError, match="SystemExit"):
        g.leave().wait(timeout=60)
    assert g.ping().wait() == ["alive"]


@survives_worker_death
def test_catch_system_failure_false_lets_the_worker_exit(cluster, groups):
    g = Exiter.create_group().launch(cluster, NodePlacementStrategy([0]), name=_name("exit"),
                                     catch_system_failure=False)
    groups.append(g)
    with pytest.raises(WorkerDiedError):
        g.leave().wait(timeout=60)


class Barrier(Worker):
    def __init__(self):
        super().__init__()
        self.barrier = threading.Barrier(2)

    def meet(self):
        self.barrier.wait(timeout=30)  # only passes if two calls run at once
        return threading.current_thread().name


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="MPI ranks run a sync worker's calls one at a time (refused)")
def test_max_concurrency_runs_sync_calls_on_threads(cluster, groups):
    g = Barrier.create_group().launch(cluster, NodePlacementStrategy([0]), name=_name("threads"), max_concurrency=2)
    groups.append(g)
    a, b = g.meet(), g.meet()
    assert len(a.wait(timeout=60) + b.wait(timeout=60)) == 2


class TimedWork(Worker):
    def __init__(self):
        super().__init__()

    @Worker.timer("work")
    def work(self):
        return self._rank


def test_rlinf_consume_duration_and_close(cluster, groups):
    """RLinf programs read ``consume_duration()`` and end groups with ``_close()`` (its benchmarks do)."""
    g = TimedWork.create_group().launch(cluster, NodePlacementStrategy([0]), name=_name("closed"))
    groups.append(g)
    result = g.work()
    assert result.wait() == [0] and set(result.consume_duration()) == {"work"}
    g._close()
    with pytest.raises(Exception, match="stopped|not running|no longer"):
        g.work().wait()
