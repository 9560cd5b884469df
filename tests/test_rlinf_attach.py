"""``WorkerGroup.from_group_name``: attach to a running group by name, on every launcher.

RLinf programs launch a group in one place and reach it by name elsewhere
(the driver later on, or another worker).  Runs on Ray and, as part of the
suites ``tests/test_mpi.py`` runs inside one ``mpiexec`` job, on MPI ranks.
"""

from __future__ import annotations

import os
import uuid

import pytest

from rlinf.scheduler import GroupNameError, NodePlacementStrategy, Worker, WorkerError
from rlinf.scheduler.worker import WorkerGroup


class Counter(Worker):
    def __init__(self, start):
        super().__init__()
        self.n = start

    def add(self, k):
        self.n += k
        return self.n

    def where(self):
        return self._rank, os.getpid()


class Visitor(Worker):
    """A worker that reaches a group it did not launch, by name."""

    def __init__(self):
        super().__init__()

    def visit(self, name):
        group = WorkerGroup.from_group_name(Counter, name)
        return group.add(100).wait(), group.world_size, group.worker_group_name


def test_from_group_name_reaches_the_same_workers(cluster):
    name = f"attach_{uuid.uuid4().hex[:6]}"
    group = Counter.create_group(10).launch(cluster, NodePlacementStrategy([0, 0]), name=name)
    visitor = None
    try:
        assert group.add(1).wait() == [11, 11]
        again = WorkerGroup.from_group_name(Counter, name, cluster)
        assert again.world_size == 2 and again.worker_group_name == name
        assert again.add(2).wait() == [13, 13]  # the very workers: their state moved on
        assert again.where().wait() == group.where().wait()
        assert [i.pid for i in again.worker_info_list] == [i.pid for i in group.worker_info_list]

        visitor = Visitor.create_group().launch(cluster, NodePlacementStrategy([0]), name=f"visitor_{name}")
        assert visitor.visit(name).wait() == [([113, 113], 2, name)]
        assert group.add(0).wait() == [113, 113]

        with pytest.raises(TypeError, match="runs workers of class Counter"):
            WorkerGroup.from_group_name(Visitor, name, cluster)
        with pytest.raises(GroupNameError, match="no group named"):
            WorkerGroup.from_group_name(Counter, f"absent_{name}", cluster)

        again.stop()  # stops the group for every handle on it
        with pytest.raises(WorkerError):
            group.add(1).wait(timeout=60)
        with pytest.raises(GroupNameError):
            WorkerGroup.from_group_name(Counter, name, cluster)
    finally:
        if visitor is not None:
            visitor.stop()
        WorkerGroup.stop(group)
