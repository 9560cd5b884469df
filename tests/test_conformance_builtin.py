"""The conformance kit run against this repository's own backends."""

import pytest

from rlinf.testing import LauncherConformance, TransportConformance


class TestCpuTransportSharedMemory(TransportConformance):
    transport_name = "cpu"


class TestCpuTransportTcp(TransportConformance):
    """The same transport forced onto its network path."""

    transport_name = "cpu"
    peer_env = {"RLINF_CPU_LOCAL": "0"}

    def connect(self, transport, peer, hello=b"conformance"):
        import os

        os.environ["RLINF_CPU_LOCAL"] = "0"
        try:
            return super().connect(transport, peer, hello)
        finally:
            del os.environ["RLINF_CPU_LOCAL"]


class TestRayLauncher(LauncherConformance):
    launcher_name = "ray"

    @pytest.fixture(scope="class")
    def conformance_cluster(self, cluster):  # the session's Ray cluster: one Ray per test session
        return cluster


def test_every_conformance_test_ran_and_passed(request):
    """Runs last in this module: each class above ran the whole kit, none skipped."""
    from conformance_counts import assert_session_ran_whole_kit

    assert_session_ran_whole_kit(request, {
        TestCpuTransportSharedMemory: TransportConformance,
        TestCpuTransportTcp: TransportConformance,
        TestRayLauncher: LauncherConformance,
    })
