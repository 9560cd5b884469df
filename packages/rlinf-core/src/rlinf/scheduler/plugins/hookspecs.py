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
* Two plugins registering the same launcher, transport, accelerator or hardware
  name: selecting that name raises an error naming both distributions.
* Selection: an explicit name wins (argument, ``CollectiveGroupOptions``),
  else ``RLINF_LAUNCHER`` / ``RLINF_TRANSPORT``, else the usable descriptor
  with the highest priority (for transports: among those serving the device).

Rules a plugin follows:

* Hooks return descriptors and nothing else; they must be cheap (no network,
  no heavy imports): do that work in ``factory``.
* ``check()`` never raises; it returns ``None`` or the reason it is unusable.
* Launchers implement ``rlinf.scheduler.plugins.launcher.Launcher``; transports
  implement ``rlinf.scheduler.plugins.transport.Transport`` (device transports
  also the optional device methods described there); accelerators are plain
  ``AcceleratorPlugin`` descriptors (see ``rlinf_register_accelerators``), hardware
  kinds plain ``HardwarePlugin`` descriptors (see ``rlinf_register_hardware``).  Core owns message
  formats, ordering, timeouts and error reporting; a backend moves processes
  or bytes.
* Every listener authenticates its peer before it reads a byte of hello or
  payload, with ``rlinf.scheduler.base.security``: pass each accepted socket to a
  ``HandshakeGate`` (uid check on Unix sockets, mutual HMAC challenge on the
  cluster secret, bounded hello, deadline, bounded handshakes in flight),
  publish its ``listener_id`` in your endpoint and run ``client_handshake``
  (naming that id) + ``send_hello`` on each socket you connect.
  ``Transport.connect`` returns only once the listener took the connection
  (``security.ACCEPTED`` / ``await_accepted``): that keeps a sender's
  reconnections, and so its messages, in order.
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


@hookspec
def rlinf_register_accelerators() -> list:
    """Return a list of ``AcceleratorPlugin`` descriptors this plugin provides.

    An accelerator descriptor tells rlinf how to find a kind of device and how
    to hand devices of that kind to workers::

        from rlinf.scheduler.plugins import AcceleratorPlugin, hookimpl

        @hookimpl
        def rlinf_register_accelerators():
            return [AcceleratorPlugin(
                name="mygpu",
                ray_resource="GPU",                       # what a Ray node advertises
                visible_devices_env="MYGPU_VISIBLE_DEVICES",
                torch_device_type="mygpu",                # torch.device("mygpu", i)
                collective_backend="myccl",               # torch.distributed backend
                device_count=_count,                      # devices visible here, 0 if none
                check=_check,                             # None or why unusable
            )]

    What rlinf does with it:

    * Launchers count a node's devices with the kind's ``ray_resource`` (Ray)
      or ``device_count()`` (MPI, local) and reserve them per worker.
    * Each worker with devices gets ``visible_devices_env`` set to the devices
      of its group on its node, its own first device at index ``LOCAL_RANK``
      (then its further devices), so ``torch.<type>.set_device(LOCAL_RANK)``
      selects its own device; ``WorkerInfo.gpu_id`` is that index and
      ``available_gpus`` the indices of all its own devices.  Other kinds'
      variables are left alone.  ``RLINF_ACCELERATOR=<name>`` in the driver
      forces a kind when several could match.
    * ``rlinf.scheduler.plugins.accelerator.current()`` returns the descriptor of the
      kind active in the calling process (a CPU descriptor when none): code
      that needs ``torch_device_type`` or the collective backend asks it.

    NVIDIA, AMD and Ascend ship with rlinf-core through this very hook
    (``rlinf.scheduler.plugins.accelerator_plugin``).
    """


@hookspec
def rlinf_register_hardware() -> list:
    """Return a list of ``HardwarePlugin`` descriptors this plugin provides.

    A hardware descriptor is a kind of device attached to nodes (a robot arm,
    ...) that a program places workers next to.  RLinf's cluster config names
    it in a node group::

        cluster:
          num_nodes: 2
          node_groups:
            - label: arms
              node_ranks: 0-1
              hardware:
                type: MyArm                  # the descriptor's name
                configs:
                  - {node_rank: 0, port: /dev/ttyUSB0}
                  - {node_rank: 1, port: /dev/ttyUSB1}

    and the plugin says how to read each entry and what it yields::

        from dataclasses import dataclass
        from rlinf.scheduler.hardware import HardwareConfig, HardwareInfo, HardwarePlugin
        from rlinf.scheduler.plugins import hookimpl

        @dataclass
        class MyArmConfig(HardwareConfig):        # node_rank comes from HardwareConfig
            port: str = "/dev/ttyUSB0"

        @dataclass
        class MyArmHWInfo(HardwareInfo):          # type and model come from HardwareInfo
            config: MyArmConfig

        @hookimpl
        def rlinf_register_hardware():
            return [HardwarePlugin(name="MyArm", config_class=MyArmConfig, info_class=MyArmHWInfo)]

    What rlinf does with it:

    * ``ClusterConfig`` (and so ``Cluster(cluster_cfg=...)``) builds each
      ``configs`` entry as ``config_class(**entry)``: missing or unknown fields,
      an entry whose ``node_rank`` is outside its group, duplicate entries, or a
      ``type`` no plugin provides are refused before anything starts
      (``ClusterConfigError``, naming the installed types).  Names match exactly,
      else case-insensitively when that is unambiguous.
    * When the cluster is made, ``enumerate(node_rank, configs)`` (default: one
      ``info_class(type=name, model=name, config=c)`` per config) gives each
      node's ``HardwareResource``; ``cluster.get_node_info(r).hardware_resources``
      lists them next to the node's accelerators (type ``"Accelerator"``).
    * Worker placement by node group (``NodePlacementStrategy(ranks,
      node_group_label="arms")``) uses the group's nodes.

    RLinf's robots (Franka, DualFranka, DOSW1, GimArm, Turtle2) ship with
    rlinf-core through this very hook (``rlinf.scheduler.hardware.robots``).
    """
