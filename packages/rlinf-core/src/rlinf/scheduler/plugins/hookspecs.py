"""Hook specifications: the contract between rlinf and its plugins.

This module is the plugin author's reference.  A plugin is a module (or any
object) with functions marked ``@hookimpl`` whose names match the specs
below, advertised through the ``rlinf`` entry-point group::

    # pyproject.toml of your distribution
    [project.entry-points.rlinf]
    mytransport = "my_package.rlinf_plugin"

    # my_package/rlinf_plugin.py
    from rlinf.scheduler.plugins import TransportPlugin, hookimpl

    @hookimpl
    def rlinf_register_transports():
        return [TransportPlugin(name="mytcp", factory=_make, priority=10, devices=("cpu",))]

Rules rlinf follows:

* Plugins are discovered lazily, on first use, from ``importlib.metadata``
  entry points in group ``rlinf``.  ``RLINF_PLUGINS_AUTOLOAD=0`` loads only the
  plugins that ship with rlinf-core plus the modules named in ``RLINF_PLUGINS``
  (comma separated ``module`` or ``name=module``).
* A plugin module that fails to import, a hook that raises, a hook named here
  with the wrong signature, or a hook name that is not specified here: the
  plugin is reported (warning, ``python -m rlinf.scheduler plugins``) and
  skipped; every other plugin keeps working.
* Two plugins registering the same launcher or transport name: selecting that
  name raises an error naming both distributions.
* Selection: an explicit name wins (argument, ``CollectiveGroupOptions``),
  else ``RLINF_LAUNCHER`` / ``RLINF_TRANSPORT``, else the usable descriptor
  with the highest priority (for transports: among those serving the device).

Rules a plugin follows:

* Hooks return descriptors and nothing else; they must be cheap (no network,
  no heavy imports): do that work in ``factory``.
* ``check()`` never raises; it returns ``None`` or the reason it is unusable.
* Launchers implement ``rlinf.scheduler.launcher.Launcher``; transports
  implement ``rlinf.scheduler.p2p.transport.Transport``.  Core owns message
  formats, ordering, timeouts and error reporting; a backend moves processes
  or bytes.
* Every listener authenticates its peer before it reads a byte of hello or
  payload, with ``rlinf.scheduler.security``: pass each accepted socket to a
  ``HandshakeGate`` (uid check on Unix sockets, mutual HMAC challenge on the
  cluster secret, bounded hello, deadline, bounded handshakes in flight) and
  run ``client_handshake`` + ``send_hello`` on each socket you connect.
  Nothing from an unauthenticated connection is ever unpickled.  Launchers
  forward the driver's ``WorkerSpec.env`` (it carries ``RLINF_CLUSTER_SECRET``)
  only through their own authenticated channel, never a file or command line.
  See ``docs/security.md``.
"""

from __future__ import annotations

import pluggy

PROJECT = "rlinf"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def rlinf_register_launchers() -> list:
    """Return a list of ``LauncherPlugin`` descriptors this plugin provides."""


@hookspec
def rlinf_register_transports() -> list:
    """Return a list of ``TransportPlugin`` descriptors this plugin provides."""
