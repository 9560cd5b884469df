"""Entry point: registers the ``plaintcp`` transport with rlinf's hooks."""

from rlinf.scheduler.plugins import TransportPlugin, hookimpl


def _make():
    from .transport import PlainTcpTransport

    return PlainTcpTransport()


@hookimpl
def rlinf_register_transports():
    return [
        TransportPlugin(
            name="plaintcp",
            factory=_make,
            priority=5,  # below the built-in transport: used when chosen by name
            devices=("cpu",),
            description="plain TCP sockets, no shared memory",
        )
    ]
