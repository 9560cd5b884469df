"""Registers the built-in CPU transport, exactly as a third-party plugin would."""

from __future__ import annotations

from ..plugins import TransportPlugin, hookimpl


def _factory():
    from .cpu_transport import CpuTransport

    return CpuTransport()


@hookimpl
def rlinf_register_transports():
    return [
        TransportPlugin(
            name="cpu",
            factory=_factory,
            priority=10,
            devices=("cpu",),
            description="sockets; memfd shared memory between processes on one host",
        )
    ]
