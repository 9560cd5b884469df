"""runtime: clusters, groups and the worker host.

``cluster`` connects to a launcher (its session), ``group`` launches and
calls worker groups, ``host`` runs a worker inside each process a launcher
starts, ``status_server`` answers status queries.  It may import every layer
below (``tracing``, ``messaging``, ``transports``, ``plugins``, ``base``).
The layers below reach it only through registration points they own: the
current session (``plugins.launcher.provide_current_session``), the
timeline's group sources (``tracing.collect.group_source``) and runtime
(``tracing.provide_runtime``), and the process lifecycle (``base.lifecycle``).
"""
