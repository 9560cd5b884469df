"""transports: the built-in ways bytes move between two processes.

The ``cpu`` transport (a listener with an authenticating handshake gate,
socket links, shared-memory framing), the payload codec, asynchronous work
handles, per-peer ordering and the routing of device tensors to device
transports.  It may import ``base`` and ``plugins`` (the interfaces it
implements), nothing above.
"""
