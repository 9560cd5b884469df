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


@pytest.mark.gpu
@pytest.mark.parametrize("name, fields", [
    ("torch-nccl", {"accel_max_ctas": 4, "accel_min_ctas": 1, "accel_cluster_size": 2, "is_high_priority_stream": True}),
    ("cupy-nccl", {"is_high_priority_stream": True}),
])
def test_a_pair_set_up_with_tuning_fields_moves_tensors(name, fields):
    """CollectiveGroupOptions fields configure the pair's communicator (NCCL config, stream priority); it works."""
    import json

    import torch

    from rlinf.scheduler.plugins import get_registry
    from rlinf.testing.transport import _Peer

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    entry = get_registry().transport(name, "cuda")
    if entry.unusable_reason():
        pytest.skip(f"{name} is not usable here: {entry.unusable_reason()}")
    torch.cuda.set_device(0)
    t = entry.descriptor.factory()
    peer = _Peer(name, dict(__import__("os").environ), "rlinf.testing._device_echo_peer", ("cuda:1",))
    try:
        link = t.connect(peer.endpoint, b"", time.monotonic() + 60, options=fields)
        assert link.options == fields
        sent = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
        link.send([json.dumps([[list(sent.shape), "float32"]]).encode()], time.monotonic() + 60)
        link.send_tensors([sent], time.monotonic() + 60)
        link.recv(time.monotonic() + 60)
        back = torch.empty_like(sent)
        link.recv_tensors_into([back], time.monotonic() + 60)
        torch.cuda.synchronize()
        assert torch.equal(back, sent)
        link.close()
    finally:
        peer.close()
        t.close()
