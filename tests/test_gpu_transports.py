"""Device-transport conformance: torch-nccl and cupy-nccl on CUDA (two GPUs), and the same
suite on CPU tensors through torch-gloo, which runs everywhere.

Without a GPU (or CuPy) the CUDA classes skip with the reason; benchmarks/gpu/check.sh runs
this file on a GPU machine.
"""

import time

import pytest

from rlinf.testing import DeviceTransportConformance

pytest.importorskip("torch")


class TestTorchGlooDeviceLink(DeviceTransportConformance):
    transport_name = "torch-gloo"
    device = peer_device = "cpu"
    big_message = 16 << 20


@pytest.mark.gpu
class TestTorchNccl(DeviceTransportConformance):
    transport_name = "torch-nccl"


@pytest.mark.gpu
class TestCupyNccl(DeviceTransportConformance):
    transport_name = "cupy-nccl"


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["torch-nccl", "cupy-nccl"])
def test_two_ends_on_one_gpu_get_a_clear_error(name):
    import torch

    from rlinf.scheduler.plugins import get_registry
    from rlinf.testing.transport import _Peer

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device is visible here")
    entry = get_registry().transport(name, "cuda")
    if entry.unusable_reason():
        pytest.skip(f"{name} is not usable here: {entry.unusable_reason()}")
    torch.cuda.set_device(0)
    t = entry.descriptor.factory()
    peer = _Peer(name, dict(__import__("os").environ), "rlinf.testing._device_echo_peer", ("cuda:0",))
    try:
        with pytest.raises(ConnectionError, match="one GPU"):
            t.connect(peer.endpoint, b"", time.monotonic() + 60)
    finally:
        peer.close()
        t.close()
