"""What a message is: objects and tensors encoded into frames, and device tensors handed to a device link.

``send``/``recv`` move an object as ``[pickle stream, buffer, ...]`` (``codec``);
``send_tensor``/``recv_tensor`` move a CPU tensor as ``[fingerprint, raw bytes]``
straight into the receiver's buffer.  An object or tensor holding device tensors
is announced on the pair's CPU path and its device tensors follow on a device
link (``device_routing``).  Each operation is one ``op(deadline)`` that the
communicator runs in the pair's turn.

``MessagesMixin`` is one part of ``Communicator`` (communicator.py), which holds
the state it uses.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any, Optional

from ...base.address import WorkerAddress
from ...base.unpicklable import UnpicklableError
from ...base.errors import CommunicationError
from ...transports import codec, device_routing

_FINGERPRINT = struct.Struct("<16sQ")


class _SendFailure:
    """Sent in place of an object that could not be serialized, so the receiver fails at once."""

    def __init__(self, text: str):
        self.text = text


def tensor_fingerprint(tensor) -> bytes:
    """16 bytes naming dtype and shape, so a mismatched ``recv_tensor`` fails instead of filling garbage."""
    dtype = str(tensor.dtype).rsplit(".", 1)[-1].encode()[:16]
    return _FINGERPRINT.pack(dtype, zlib.crc32(repr(tuple(tensor.shape)).encode()))


class MessagesMixin:
    """``send_object``/``recv_object``/``send_tensor``/``recv_tensor`` and their device paths, for ``Communicator``."""

    name: str
    _out: dict
    _in: dict
    _local_ip: str

    def send_object(self, obj: Any, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool,
                    options=None):
        transport = self.transport_name(transport)
        if device_routing.may_hold_device_tensors(obj) and device_routing.needs_device_path(obj):
            return self._send_with_device_tensors(obj, peer, transport, timeout, async_op, options)
        try:
            header, buffers = codec.encode(obj, what=lambda: f"the object sent to {peer.get_name()}", root="object")
            failure = None
        except Exception as exc:
            header, buffers = codec.encode(_SendFailure(f"{type(exc).__name__}: {exc}"))
            failure = exc
        pair = self._pair(self._out, peer.get_name())

        def op(deadline):
            self._send_frames(peer, transport, [header, *buffers], deadline)

        result = self._run(pair, op, async_op and failure is None, "send", peer, timeout)
        if isinstance(failure, UnpicklableError):  # it names the peer, the part and the fix already
            failure.args = (f"{self.name}: cannot send {type(obj).__name__} to {peer.get_name()!r}: {failure}",)
            raise failure
        if failure is not None:
            raise TypeError(f"{self.name}: cannot send {type(obj).__name__} to {peer.get_name()!r}: {failure}") from failure
        return result

    def _send_with_device_tensors(self, obj: Any, peer: WorkerAddress, transport: str, timeout: float, async_op: bool,
                                  options=None):
        """Metadata on this pair's CPU path, device tensors on a device link (see ``device_routing``).

        ``options`` (``CollectiveGroupOptions``) the device transport cannot honour fail here, before anything is sent.
        """
        pair = self._pair(self._out, peer.get_name())
        fields = _link_fields(options)

        def op(deadline):
            def send_meta(envelope):
                header, buffers = codec.encode(envelope)
                self._send_frames(peer, transport, [header, *buffers], deadline)

            device_routing.router().send(send_meta, obj, self.name, peer.get_name(), deadline, self._local_ip,
                                         options=fields)

        return self._run(pair, op, async_op, "send", peer, timeout)

    def recv_object(self, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool,
                    options=None):
        transport = self.transport_name(transport)
        pair = self._pair(self._in, peer.get_name())
        fields = _receiving_fields(options)

        def op(deadline):
            raw, frames = self._receive(peer, transport, deadline, lambda link: link.recv(deadline))
            if raw:
                raise CommunicationError(
                    f"{self.name}: {peer.get_name()!r} sent a tensor with send_tensor(), but this side called recv(); "
                    f"use recv_tensor() for it",
                    peer=peer.get_name(),
                )
            obj = codec.decode(frames[0], frames[1:])
            if isinstance(obj, _SendFailure):
                raise CommunicationError(
                    f"{self.name}: {self._describe(peer)} failed to serialize the object it sent: {obj.text}",
                    peer=peer.get_name(),
                )
            if isinstance(obj, device_routing.DeviceEnvelope):  # its device tensors follow on a device link
                router = device_routing.router()
                obj = router.unwrap(obj, self.name, deadline, options=_lenient_fields(router, options, fields))
            return obj

        return self._run(pair, op, async_op, "recv", peer, timeout)

    def send_tensor(self, tensor, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool,
                    options=None):
        transport = self.transport_name(transport)
        if tensor.device.type != "cpu":  # announced on the CPU path, moved on a device link
            return self._send_with_device_tensors(tensor, peer, transport, timeout, async_op, options)
        fingerprint = tensor_fingerprint(tensor)
        payload = codec.tensor_bytes(tensor)
        pair = self._pair(self._out, peer.get_name())

        def op(deadline):
            self._send_frames(peer, transport, [fingerprint, payload], deadline, raw=True)

        return self._run(pair, op, async_op, "send_tensor", peer, timeout)

    def recv_tensor(self, tensor, peer: WorkerAddress, transport: Optional[str], timeout: float, async_op: bool,
                    options=None):
        transport = self.transport_name(transport)
        if tensor.device.type != "cpu":
            return self._recv_device_tensor(tensor, peer, transport, timeout, async_op, options)
        expected = tensor_fingerprint(tensor)
        got = bytearray(_FINGERPRINT.size)
        target = codec.tensor_bytes(tensor)
        pair = self._pair(self._in, peer.get_name())

        def op(deadline):
            try:
                raw = self._receive(peer, transport, deadline, lambda link: link.recv_into([got, target], deadline))
            except ValueError as exc:
                raise CommunicationError(
                    f"{self.name}: recv_tensor from {peer.get_name()!r} into a {tuple(tensor.shape)} {tensor.dtype} "
                    f"buffer does not match what was sent ({exc}); the message was discarded",
                    peer=peer.get_name(),
                ) from None
            if not raw:
                raise CommunicationError(
                    f"{self.name}: {peer.get_name()!r} sent an object with send(), but this side called recv_tensor(); "
                    f"the message was discarded",
                    peer=peer.get_name(),
                )
            if bytes(got) != expected:
                dtype = _FINGERPRINT.unpack(bytes(got))[0].rstrip(b"\0").decode(errors="replace")
                raise CommunicationError(
                    f"{self.name}: recv_tensor from {peer.get_name()!r}: the sender's tensor ({dtype}) has another "
                    f"dtype or shape than the {tuple(tensor.shape)} {tensor.dtype} buffer given here",
                    peer=peer.get_name(),
                )
            return tensor

        return self._run(pair, op, async_op, "recv_tensor", peer, timeout)

    def _recv_device_tensor(self, tensor, peer: WorkerAddress, transport: str, timeout: float, async_op: bool,
                            options=None):
        """``recv_tensor`` into a device buffer: the announcement on the CPU path, the data on a device link."""
        pair = self._pair(self._in, peer.get_name())
        fields = _link_fields(options)

        def op(deadline):
            raw, frames = self._receive(peer, transport, deadline, lambda link: link.recv(deadline))
            envelope = None if raw else codec.decode(frames[0], frames[1:])
            if not isinstance(envelope, device_routing.DeviceEnvelope):
                raise CommunicationError(
                    f"{self.name}: recv_tensor into a {tensor.device} buffer from {peer.get_name()!r}, which sent "
                    f"{'a CPU tensor' if raw else 'an object'}; send_tensor a tensor on a device to fill a device "
                    f"buffer (the message was discarded)",
                    peer=peer.get_name(),
                )
            try:
                device_routing.router().receive_into(envelope, tensor, self.name, deadline, options=fields)
            except ValueError as exc:
                raise CommunicationError(
                    f"{self.name}: recv_tensor from {peer.get_name()!r}: {exc}", peer=peer.get_name()) from None
            return tensor

        return self._run(pair, op, async_op, "recv_tensor", peer, timeout)


def _link_fields(options) -> dict:
    """A device operation's tuning fields, checked against the device transport now (a field it cannot honour
    fails before anything moves)."""
    return device_routing.router().link_options(options) if options is not None else {}


def _receiving_fields(options) -> Optional[dict]:
    """A receiving call's tuning fields, checked against the device transport now when this process
    can hold device tensors (so a field it cannot honour fails before anything is received); else
    None: they are looked at only if a device envelope arrives."""
    if options is None or not options.transport_options():
        return {}
    if device_routing.may_hold_device_tensors(None):
        return _link_fields(options)
    return None


def _lenient_fields(router, options, fields: Optional[dict]) -> dict:
    """The fields for a link set up on receipt: those checked up front, else those the transport honours."""
    if fields is not None:
        return fields
    from ...plugins.options import LINK_FIELDS, honoured

    can = honoured(router.entry.descriptor)
    return {k: v for k, v in options.transport_options().items() if k in LINK_FIELDS and k in can}
