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
    """Subclass and set ``transport_name``, ``device`` (this end) and ``peer_device``.

    pytest collects the subclass's ``test_*`` methods; each gets a fresh
    ``transport`` (skipped when either device is missing or the plugin's
    ``check`` says it is unusable here; on CUDA the current device is set to
    ``device``) and ``peer``, a second process that receives tensors on
    ``peer_device`` and sends them back (a ``"die"`` header makes it exit with
    code 17).  ``peer_env`` adds environment variables for the peer;
    ``big_message`` is the largest tensor sent, in bytes.

    Example:
        ```python
        class TestMyGpuTransport(DeviceTransportConformance):
            transport_name = "my-gpu"
            device, peer_device = "cuda:0", "cuda:1"
        ```
    """

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
        """The ``time.monotonic()`` deadline ``seconds`` from now that the suite gives each send and receive.

        Override it for a transport whose first transfer (device setup, a communicator) takes longer.

        Args:
            seconds (float): how long from now.
        """
        return time.monotonic() + seconds

    def roundtrip(self, link, tensors):
        """Send ``tensors`` to the peer and return the copies it sends back, received into new tensors.

        Sends a JSON header of shapes and dtypes with ``send``, the tensors with ``send_tensors``, then
        receives the echoed header with ``recv`` and the tensors with ``recv_tensors_into`` into
        ``torch.empty_like`` buffers on ``device``.  Override it only if the transport's ``DeviceLink``
        needs another sequence of calls (the peer expects this one).

        Args:
            link (DeviceLink): a link from ``connect``.
            tensors (list[torch.Tensor]): tensors on ``device``.
        """
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
        """Open a device link to the peer; every test connects through this.

        Override it when the transport needs more than ``connect(endpoint, hello, deadline)`` (options, say);
        the link returned must implement ``DeviceLink``.  Returns the link.

        Args:
            transport (Transport): the transport under test (the ``transport`` fixture).
            peer (_Peer): the echo peer (the ``peer`` fixture); ``peer.endpoint`` is what it published.
        """
        return transport.connect(peer.endpoint, b"device-conformance", self.deadline())

    # -- the contract --------------------------------------------------------------------
    def test_tensors_of_every_dtype_and_size(self, transport, peer):
        """float32, bfloat16, bool, a ``big_message``-sized int64 and an empty tensor come back equal, with
        their dtype, shape and device.

        Fixtures: ``transport`` (the plugin's transport on ``device``) and ``peer`` (the echo process on
        ``peer_device``).
        """
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
        """One link carries 20 round trips of tensors of different sizes, each received in order and intact.

        Fixtures: ``transport`` (the plugin's transport on ``device``) and ``peer`` (the echo process on
        ``peer_device``).
        """
        import torch

        link = self.connect(transport, peer)
        for i in range(20):
            t = torch.full((1000 + i,), float(i), device=self.device)
            (b,) = self.roundtrip(link, [t])
            assert torch.equal(b, t)

    def test_ordered_after_the_callers_stream(self, transport, peer):
        """Data written by queued work on the current stream is what arrives (no host sync first).

        The send must be ordered after kernels the caller queued on its current stream.
        Fixtures: ``transport`` and ``peer``.
        """
        import torch

        link = self.connect(transport, peer)
        t = torch.zeros(8 * MiB // 4, device=self.device)
        t.add_(3.0)  # queued on the current stream; the transport must order after it
        t.mul_(2.0)
        (b,) = self.roundtrip(link, [t])
        assert float(b[-1]) == 6.0 and float(b[0]) == 6.0

    def test_recv_deadline(self, transport, peer):
        """A receive with nothing to read raises ``TimeoutError`` at its deadline, and the link still works.

        Fixtures: ``transport`` (the plugin's transport on ``device``) and ``peer`` (the echo process on
        ``peer_device``).
        """
        import torch

        link = self.connect(transport, peer)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            link.recv(time.monotonic() + 0.3)
        assert time.monotonic() - start < 10
        (b,) = self.roundtrip(link, [torch.ones(4, device=self.device)])
        assert torch.equal(b, torch.ones(4, device=self.device))

    def test_peer_death_raises(self, transport, peer):
        """When the peer process dies, a pending receive raises ``ConnectionError`` or ``TimeoutError``
        instead of hanging.

        Fixtures: ``transport`` (the plugin's transport on ``device``) and ``peer`` (the echo process on
        ``peer_device``).
        """
        link = self.connect(transport, peer)
        link.send([json.dumps("die").encode()], self.deadline())
        with pytest.raises((ConnectionError, TimeoutError)):
            link.recv(self.deadline(20))
        assert peer.proc.wait(10) == 17

    def test_refuses_other_devices(self, transport):
        """Asking the registry for this transport on a device it does not declare raises ``PluginError``
        naming it (skipped when it serves both CPU and CUDA).

        Fixture: ``transport`` (only to skip where the transport or devices are unavailable).
        """
        from rlinf.scheduler.base.errors import PluginError
        from rlinf.scheduler.plugins import get_registry

        entry = get_registry().transport(self.transport_name, self.device.split(":")[0])
        other = "cpu" if self.device.startswith("cuda") else "cuda"
        if other in entry.descriptor.devices:
            pytest.skip(f"{self.transport_name} serves {other} too")
        with pytest.raises(PluginError, match=self.transport_name):
            get_registry().transport(self.transport_name, other)
