"""messaging: point-to-point messages, broadcasts and channels' wire protocol.

``messaging.p2p``: the process's communicator (links to peers, found through
the launcher's registry), ``send``/``recv``, broadcasts and published
endpoints.  ``messaging.channel``: the channel host's queues and the client
that talks to them.  It may import ``base``, ``plugins`` and ``transports``;
it finds peer groups through ``plugins.launcher.current_session``, which the
runtime registers, and lets go of its links through ``base.lifecycle``.
"""
