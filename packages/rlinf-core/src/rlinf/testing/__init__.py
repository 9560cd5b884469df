"""Conformance suites for rlinf plugins, ready for pytest.

Subclass the suite for your plugin in a test module of your own::

    from rlinf.testing import TransportConformance

    class TestMyTransport(TransportConformance):
        transport_name = "mytransport"

    from rlinf.testing import LauncherConformance

    class TestMyLauncher(LauncherConformance):
        launcher_name = "mylauncher"
        cluster_options = {}

    from rlinf.testing import DeviceTransportConformance

    class TestMyGpuTransport(DeviceTransportConformance):
        transport_name = "mygpu"
        device, peer_device = "cuda:0", "cuda:1"

Every test uses real processes; none mocks what it checks.
"""

from .device import DeviceTransportConformance
from .launcher import LauncherConformance
from .transport import TransportConformance

__all__ = ["DeviceTransportConformance", "LauncherConformance", "TransportConformance"]
