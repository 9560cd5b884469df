"""Shared fixtures: one real local Ray cluster per test session, on loopback.

Ray keeps its files under the session's temp dir (never ``$HOME``); token
authentication stays on, with the token in the environment.

With ``RLINF_TEST_LAUNCHER=mpi`` (the suite running as the program of
``mpiexec -n N python -m rlinf.mpi -m pytest ...``) the same tests run on the
MPI job's ranks instead; tests that need Ray, or a worker process that can
die without ending the job, are skipped there with the reason.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import pytest


from launcher_marks import TEST_LAUNCHER


@pytest.fixture(scope="session")
def cluster():
    from rlinf.scheduler import Cluster

    if TEST_LAUNCHER == "mpi":
        c = Cluster(launcher="mpi")
        yield c
        c.shutdown()
        return
    temp_dir = tempfile.mkdtemp(prefix="rlt")  # short: Ray's socket paths must fit in 107 bytes
    # where the embedded cluster says it runs (for the status command): the suite's own, not the user's
    os.environ.setdefault("RLINF_STATUS_DIR", os.path.join(temp_dir, "status"))
    c = Cluster(num_nodes=1, launcher="ray", temp_dir=temp_dir, num_cpus=2, log_to_driver=False)
    yield c
    c.shutdown()
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _stop_what_the_test_left_running():
    """Groups a test launched in this process and left running (a channel's host, a group launched
    without ``launch``) stop when it ends: idle workers cost CPU (about 1% each) and memory (about
    95 MiB each), which a long suite would otherwise pay in every later test."""
    from rlinf.scheduler.runtime import group

    before = set(group._launched)
    yield
    for g in set(group._launched) - before:
        try:
            group.WorkerGroup.stop(g)  # the group's own stop, even if its workers define one
        except Exception as exc:  # its processes may be gone already: nothing left to free
            print(f"stopping {g!r} after the test: {type(exc).__name__}: {exc}")


@pytest.fixture
def launch(cluster):
    """Launch groups that are stopped when the test ends."""
    groups = []

    def _launch(worker_cls, *args, placement=None, name=None, **kwargs):
        name = name or f"{worker_cls.__name__}_{uuid.uuid4().hex[:6]}"
        group = worker_cls.create_group(*args, **kwargs).launch(cluster=cluster, placement_strategy=placement, name=name)
        groups.append(group)
        return group

    yield _launch
    for g in reversed(groups):
        g.stop()
