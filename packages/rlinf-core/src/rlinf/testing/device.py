"""``DeviceTransportConformance``: what a device transport must do, per device.

Parametrized by ``device`` (``"cuda:0"``, or ``"cpu"`` for a transport such as
``torch-gloo`` whose links implement ``DeviceLink`` on CPU tensors): a real
second process (``rlinf.testing._device_echo_peer``) receives tensors with
``recv_tensors_into`` on ``peer_device`` and sends them back, and the suite
checks dtypes and sizes, order, the caller's stream ordering (CUDA), deadlines,
peer death, and that a transport refuses devices it does not serve.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from .transport import _Peer

MiB = 1 << 20


def _device_unavailable(device: str):
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return "no CUDA device is visible here"
        index = torch.device(device).index or 0
        if index >= torch.cuda.device_count():
            return f"{device} needs {index + 1} GPUs, {torch.cuda.device_count()} visible"
    return None


class DeviceTransportConformance:
    """Subclass and set ``transport_name``, ``device`` (this end) and ``peer_device``."""

    transport_name: str = ""
    device: str = "cuda:0"
    peer_device: str = "cuda:1"  # NCCL needs two GPUs; CUDA IPC or gloo may use one
    peer_env: dict = {}
    big_message = 64 * MiB

    @pytest.fixture
    def transport(self):
        from rlinf.scheduler.plugins import get_registry

        for d in (self.device, self.peer_device):
            reason = _device_unavailable(d)
            if reason:
                pytest.skip(f"{self.transport_name} on {d}: {reason}")
        entry = get_registry().transport(self.transport_name, self.device.split(":")[0])
        reason = entry.unusable_reason()
        if reason:
            pytest.skip(f"transport {self.transport_name!r} is not usable here: {reason}")
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.set_device(torch.device(self.device))
        t = entry.descriptor.factory()
        yield t
        t.close()

    @pytest.fixture
    def peer(self, transport):
        from rlinf.scheduler.base.security import cluster_secret

        cluster_secret()  # made here if absent, so the peer inherits the same one
        p = _Peer(self.transport_name, dict(os.environ, **self.peer_env), "rlinf.testing._device_echo_peer",
                  (self.peer_device,))
        yield p
        p.close()

    @staticmethod
    def deadline(seconds=60.0):
        return time.monotonic() + seconds

    def roundtrip(self, link, tensors):
        import torch

        head = json.dumps([[list(t.shape), str(t.dtype).removeprefix("torch.")] for t in tensors]).encode()
        link.send([head], self.deadline())
        link.send_tensors(tensors, self.deadline())
        _, frames = link.recv(self.deadline())
        assert bytes(frames[0]) == head
        back = [torch.empty_like(t) for t in tensors]
        link.recv_tensors_into(back, self.deadline())
        return back

    def connect(self, transport, peer):
        return transport.connect(peer.endpoint, b"device-conformance", self.deadline())

    # -- the contract --------------------------------------------------------------------
    def test_tensors_of_every_dtype_and_size(self, transport, peer):
        import torch

        link = self.connect(transport, peer)
        tensors = [
            torch.arange(7, dtype=torch.float32, device=self.device),
            torch.ones((3, 5), dtype=torch.bfloat16, device=self.device),
            torch.tensor([True, False, True], device=self.device),
            torch.randint(0, 100, (self.big_message // 8,), dtype=torch.int64, device=self.device),
            torch.empty(0, device=self.device),
        ]
        back = self.roundtrip(link, tensors)
        for a, b in zip(tensors, back):
            assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and torch.equal(a, b)

    def test_order_and_repeated_use(self, transport, peer):
        import torch

        link = self.connect(transport, peer)
        for i in range(20):
            t = torch.full((1000 + i,), float(i), device=self.device)
            (b,) = self.roundtrip(link, [t])
            assert torch.equal(b, t)

    def test_ordered_after_the_callers_stream(self, transport, peer):
        """Data written by queued work on the current stream is what arrives (no host sync first)."""
        import torch

        link = self.connect(transport, peer)
        t = torch.zeros(8 * MiB // 4, device=self.device)
        t.add_(3.0)  # queued on the current stream; the transport must order after it
        t.mul_(2.0)
        (b,) = self.roundtrip(link, [t])
        assert float(b[-1]) == 6.0 and float(b[0]) == 6.0

    def test_recv_deadline(self, transport, peer):
        import torch

        link = self.connect(transport, peer)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            link.recv(time.monotonic() + 0.3)
        assert time.monotonic() - start < 10
        (b,) = self.roundtrip(link, [torch.ones(4, device=self.device)])
        assert torch.equal(b, torch.ones(4, device=self.device))

    def test_peer_death_raises(self, transport, peer):
        link = self.connect(transport, peer)
        link.send([json.dumps("die").encode()], self.deadline())
        with pytest.raises((ConnectionError, TimeoutError)):
            link.recv(self.deadline(20))
        assert peer.proc.wait(10) == 17

    def test_refuses_other_devices(self, transport):
        from rlinf.scheduler.base.errors import PluginError
        from rlinf.scheduler.plugins import get_registry

        entry = get_registry().transport(self.transport_name, self.device.split(":")[0])
        other = "cpu" if self.device.startswith("cuda") else "cuda"
        if other in entry.descriptor.devices:
            pytest.skip(f"{self.transport_name} serves {other} too")
        with pytest.raises(PluginError, match=self.transport_name):
            get_registry().transport(self.transport_name, other)
