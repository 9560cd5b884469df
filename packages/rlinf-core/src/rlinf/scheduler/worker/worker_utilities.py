"""RLinf's worker utilities on ``Worker``: device lock, free ports, profiling, names, liveness.

* ``device_lock``: workers sharing an accelerator on a node hold it one at a
  time, across groups; a worker that dies holding it frees it (``worker.lock``).
* ``acquire_free_port()``: a port free when handed that no other worker of the
  node is handed while this one lives.
* ``start_profile(step)`` / ``stop_profile()``: a ``torch.profiler`` window,
  opened when the cluster config's ``profiling`` section profiles the worker's
  group (``worker_groups``) and that step (``steps``); ``stop_profile`` writes
  the window as a Chrome trace to
  ``<output_dir>/rlinf_profile_<worker name>_<pid>_step<step>.json``
  (``output_dir`` from the section, else ``$TMPDIR/rlinf-profiles-<uid>``,
  private to the user) and returns its path.  The trace is written to a new
  file beside that path and renamed over it: a link planted at the path is
  replaced, never followed.  With ``backend: nsight`` and a
  GPU, the CUDA profiler API range (``torch.cuda.profiler.start``/``stop``)
  opens and closes with it, as RLinf's ``nsys --capture-range=cudaProfilerApi``
  expects.  Without the section they do nothing.
* Before the user's class is built (``__new__``, as RLinf), a worker applies the
  variables it was allocated with (``Cluster.allocate``) and runs RLinf's
  extension hook (``RLINF_EXT_MODULE``, see ``cluster.utils``).
"""

from __future__ import annotations

import functools
import os
from typing import Optional

from ..base import context, jsonfile, timing
from ..base.processes import process_running
from ..cluster import Cluster
from ..cluster.allocation import apply_allocated_env
from ..cluster.utils import load_user_extension_module
from ..runtime.cluster_helpers import ProfileSettings, default_profile_output_dir, profile_output_prefix
from .lock import DeviceLock, acquire_port

#: how many ports ``acquire_free_port`` tries by default (RLinf's)
PORT_TRIES = 10000


def export_profile(profiler, path: str) -> str:
    """Write ``profiler``'s Chrome trace to ``path`` through a new file beside it, renamed over it
    (``jsonfile.replace_by``): whatever another user planted at ``path`` (a link to a file of ours) is
    replaced, not written through."""
    return jsonfile.replace_by(path, profiler.export_chrome_trace, ".rlinf-profile-", ".json")


class WorkerUtilities:
    """Mixin of ``Worker``: the utilities RLinf's workers call on themselves."""

    def __new__(cls, *args, **kwargs):
        if context.current() is not None:  # in a worker process, before the class's __init__ (RLinf's place)
            apply_allocated_env()
            load_user_extension_module()
        return super().__new__(cls)

    # -- names --------------------------------------------------------------
    def get_name(self) -> str:
        """This worker's name, ``WorkerAddress.get_name()`` (``"actor:0"``)."""
        return self._worker_address.get_name()

    def get_parent_rank(self) -> int:
        """The rank of the worker that started this one (the second-to-last rank of its address); 0 for a
        worker of a group launched from the driver, as in RLinf."""
        ranks = self._worker_address.rank_path
        return ranks[-2] if len(ranks) > 1 else 0

    @property
    def manager_proxy(self):
        """RLinf's handle on its manager process: ``None`` here (there is none), which the routing helpers
        (``get_group_world_size``) accept."""
        return self._manager_proxy

    @property
    def _cluster_node_rank(self) -> int:
        """RLinf's attribute: the rank of this worker's node."""
        return self._worker_info.node_id

    @property
    def _timer_metrics(self) -> dict:
        """RLinf's store of this process's timings not popped yet, ``{tag: seconds}`` (edits show in
        ``pop_execution_time(s)``)."""
        return timing._unpopped

    # -- hardware -----------------------------------------------------------
    @property
    def accelerator_ids(self) -> list[str]:
        """The node's ids of this worker's accelerators (as its visible-devices variable lists them); [] without."""
        own = list(self._worker_info.available_gpus or [])
        if not own:
            return []
        from ..plugins import accelerator

        var = accelerator.current().visible_devices_env
        visible = [d.strip() for d in os.environ.get(var, "").split(",") if d.strip()] if var else []
        return [visible[i] if i < len(visible) else str(i) for i in own]

    @property
    def hardware_infos(self) -> list:
        """The ``HardwareInfo`` records of the hardware this worker was placed on (robots, accelerators)."""
        return list(self._worker_info.hardware_infos or [])

    @property
    def hardware_type(self) -> Optional[str]:
        """The kind of hardware this worker's node group runs on: its hardware's ``type``, else
        ``"Accelerator"`` on a node with accelerators, else None (RLinf's node group ``hardware_type``)."""
        infos = self.hardware_infos
        if infos:
            return infos[0].type
        if self._worker_info.available_gpus:
            return "Accelerator"
        if context.current() is None:  # a worker built outside a group knows of no cluster
            return None
        try:
            node = Cluster().get_node_info(self._worker_info.node_id)
        except Exception:
            return None
        return "Accelerator" if node.num_gpus else None

    # -- device lock and ports ------------------------------------------------
    @property
    def device_lock(self) -> DeviceLock:
        """This worker's ``DeviceLock`` (a context manager with ``acquire``/``release``; see ``worker.lock``)."""
        lock = self.__dict__.get("_rlinf_device_lock")
        if lock is None:
            lock = self.__dict__.setdefault("_rlinf_device_lock", DeviceLock(self))
        return lock

    def acquire_free_port(self, max_port_num: Optional[int] = None) -> int:
        """A TCP port free on this node now, handed to no other worker of the node while this one lives.

        Args:
            max_port_num: the largest acceptable port (RLinf's argument: for a server that derives a
                second port from this one and would overflow past 65535); any port when ``None``.

        Returns:
            The port (nothing listens on it yet: the caller binds it).

        Raises:
            ValueError: ``max_port_num`` is not an int in 1024..65535.
            RuntimeError: no port could be had in 10000 tries (RLinf's count).
        """
        if max_port_num is not None and (isinstance(max_port_num, bool) or not isinstance(max_port_num, int)
                                         or not 1024 <= max_port_num <= 65535):
            raise ValueError(f"max_port_num must be an int in 1024..65535, got {max_port_num!r}")
        return acquire_port(functools.partial(Cluster.find_free_port, max_port_num), PORT_TRIES)

    # -- profiling ----------------------------------------------------------
    def _profile_settings(self) -> Optional[ProfileSettings]:
        settings = self.__dict__.get("_rlinf_profile_settings", False)
        if settings is False:
            cfg = Cluster().cluster_cfg if context.current() is not None else None
            settings = ProfileSettings.from_config((cfg or {}).get("profiling"))
            self.__dict__["_rlinf_profile_settings"] = settings
        return settings

    def start_profile(self, step_idx: int) -> None:
        """Open a profiler window for step ``step_idx`` if the cluster config profiles this group and step.

        Args:
            step_idx: the training step (matched against the section's ``steps``).
        """
        settings = self._profile_settings()
        if settings is None or not settings.profiles_worker_group(self._worker_address.root_group_name) \
                or not settings.should_profile_step(step_idx) or self.__dict__.get("_rlinf_profile") is not None:
            return
        import torch

        activities = [torch.profiler.ProfilerActivity.CPU]
        cuda = torch.cuda.is_available() and bool(self._worker_info.available_gpus)
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        profiler = torch.profiler.profile(activities=activities)
        profiler.start()
        if cuda and settings.backend == "nsight":
            torch.cuda.profiler.start()
        self.__dict__["_rlinf_profile"] = (profiler, step_idx, cuda and settings.backend == "nsight", settings)
        self._logger.info(f"profiler window opened at step {step_idx}")

    def stop_profile(self) -> Optional[str]:
        """Close the profiler window, writing it as a Chrome trace.

        Returns:
            The file written, or None when no window was open.
        """
        window = self.__dict__.pop("_rlinf_profile", None)
        if window is None:
            return None
        profiler, step, nsight, settings = window
        if nsight:
            import torch

            torch.cuda.profiler.stop()
        profiler.stop()
        out = settings.output_dir or default_profile_output_dir()
        os.makedirs(out, mode=0o700, exist_ok=True)
        path = profile_output_prefix(self.get_name(), out).replace("%p", f"{os.getpid()}_step{step}") + ".json"
        return os.path.abspath(export_profile(profiler, path))

    # -- liveness -----------------------------------------------------------
    @staticmethod
    def check_worker_alive(worker_name: str) -> bool:
        """Whether the worker named ``worker_name`` (``"group:rank"``) is alive in this process's cluster.

        False when its group is not running or has no such rank, when its process (on this host) has
        ended, or when this process has no cluster; a worker on another host counts as alive while its
        group runs.

        Args:
            worker_name: the worker's name, ``WorkerAddress.get_name()``.
        """
        from ..base.address import WorkerAddress

        address = WorkerAddress.from_name(worker_name)
        if context.current() is None and not Cluster.has_initialized():
            return False  # no cluster here: asking must not start one
        record = Cluster().session.lookup_group(address.root_group_name)
        if record is None:
            return False
        worker = next((w for w in record.workers if w.info.address == address), None)
        if worker is None:
            return False
        import socket

        if worker.info.hostname != socket.gethostname() or not worker.info.pid:
            return True
        return process_running(worker.info.pid)
