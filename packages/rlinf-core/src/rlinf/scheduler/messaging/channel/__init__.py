"""A channel's queues (the host's ``server``) and the client that reaches them, with their protocol."""
