"""The conformance kit against the MPI launcher and transport.

Runs only inside an MPI job (``tests/test_mpi.py`` starts one with this file
among the suites it runs); the transport's echo peer is a worker on another
rank, since MPI links only join ranks of one job.
"""

import json

import pytest

from launcher_marks import TEST_LAUNCHER
from rlinf.scheduler import NodePlacementStrategy, Worker
from rlinf.testing import LauncherConformance, TransportConformance

pytestmark = pytest.mark.skipif(TEST_LAUNCHER != "mpi", reason="runs inside an MPI job (tests/test_mpi.py starts one)")


class EchoPeer(Worker):
    """The kit's echo peer, as a worker on an MPI rank."""

    def __init__(self):
        super().__init__()
        from rlinf.testing._echo_peer import echo_serve

        from rlinf.mpi.transport import MpiTransport

        self.transport = MpiTransport()
        self.endpoint = self.transport.listen(echo_serve, "127.0.0.1")

    def get_endpoint(self):
        return json.dumps(self.endpoint)


class _WorkerPeer:
    def __init__(self, cluster):
        self.group = EchoPeer.create_group().launch(cluster, NodePlacementStrategy([0]), name="mpi_echo_peer")
        self.endpoint = json.loads(self.group.get_endpoint().wait()[0])

    def close(self):
        self.group.stop()


#: kit tests that cannot run inside an MPI job (their end is the job's end); tests/test_mpi.py counts the rest
NOT_IN_JOB = {"TestMpiTransport": {"test_peer_death_raises_connection_error", "test_connect_to_nothing_fails_fast",
                                    "test_a_process_with_another_secret_is_refused"},
              "TestMpiLauncher": {"test_killed_worker_is_reported"}}


class TestMpiTransport(TransportConformance):
    transport_name = "mpi"

    @pytest.fixture
    def peer(self, cluster):
        p = _WorkerPeer(cluster)
        yield p
        p.close()

    # a rank that dies ends the whole MPI job, so these two are not run here: tests/test_mpi.py kills a
    # worker during an MPI receive in a job of its own, where the end of the job is what it checks
    test_peer_death_raises_connection_error = None
    test_connect_to_nothing_fails_fast = None

    # the mpi transport opens no socket: its links ride on the MPI job's communicator, which is trusted as
    # a whole (docs/security.md); the cpu listeners open in an MPI job are attacked in tests/test_security.py
    test_a_process_with_another_secret_is_refused = None


class TestMpiLauncher(LauncherConformance):
    launcher_name = "mpi"

    @pytest.fixture(scope="class")
    def conformance_cluster(self, cluster):
        return cluster

    test_killed_worker_is_reported = None  # ends the job under MPI: tests/test_mpi.py checks that end


class ChannelUser(Worker):
    def put_and_report(self, ch, item):
        ch.put(item)
        return type(ch._client()._link).__module__


def test_channels_and_point_to_point_travel_over_mpi(cluster):
    from rlinf.scheduler import Channel

    ch = Channel.create("over_mpi")
    g = ChannelUser.create_group().launch(cluster, NodePlacementStrategy([0]), name="chan_over_mpi")
    try:
        assert g.put_and_report(ch, {"x": 1}).wait() == ["rlinf.mpi.transport"]
        assert ch.get(timeout=30) == {"x": 1}
        assert type(ch._client()._link).__module__ == "rlinf.mpi.transport"  # the driver's connection too
    finally:
        g.stop()
