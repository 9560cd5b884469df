"""The launcher-neutral part of a worker process.

Every launcher puts one ``WorkerHost`` in each process it starts and forwards
calls to it.  The host sets the group's environment variables, builds the
user's worker, runs methods with per-call timing, and turns any exception
into an error that names group, rank, node and method and carries the
traceback, so that every launcher reports failures the same way.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import pickle
import socket
import sys
import time
import traceback
from typing import Any, Optional

from . import context, timing
from .errors import CommunicationError, LaunchError, WorkerMethodError
from .info import WorkerInfo
from .launcher import CallOutcome, WorkerRecord, WorkerSpec, to_wire
from .serialization import loads_worker_payload


def reserve_port(host: str = "") -> tuple[socket.socket, int]:
    """Bind a port chosen by the OS and keep it bound (not listening).

    While the socket is held no other process is handed the port, yet a
    server that binds with ``SO_REUSEADDR`` (as torch's TCPStore does) can
    still take it: no race between choosing a port and using it.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock, sock.getsockname()[1]


def _picklable(exc: BaseException) -> Optional[BaseException]:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return None


class WorkerHost:
    """Owns the user's worker object inside its process."""

    def __init__(self):
        self._instance: Any = None
        self._ctx: Optional[context.WorkerContext] = None
        self._held_port: Optional[socket.socket] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._saved_env: dict = {}  # device variables as they were before construct, restored by release

    # -- start-up -----------------------------------------------------------
    def reserve_master_port(self) -> int:
        """Called on rank 0 before construction: the port for MASTER_PORT."""
        if self._held_port is None:
            self._held_port, _ = reserve_port()
        return self._held_port.getsockname()[1]

    def _error_fields(self, method: Optional[str]) -> dict:
        ctx = self._ctx
        if ctx is None:
            return dict(method=method, pid=os.getpid())
        return dict(
            group=ctx.group_key,
            rank=ctx.rank,
            node=ctx.info.node_id,
            node_ip=ctx.info.node_ip,
            method=method,
            pid=os.getpid(),
        )

    def construct(self, spec: WorkerSpec, payload: bytes, master_port: int, launcher: str, node_ip: str) -> WorkerRecord:
        """Set the environment, build the worker, and return its registry record."""
        env = dict(spec.env)
        env["MASTER_PORT"] = str(master_port)
        placement = spec.placement
        self._set_device_env(spec, env)
        os.environ.update(env)
        own = placement.device_indices if placement.visible_gpu_ids else []
        info = WorkerInfo(
            address=spec.address,
            rank=placement.rank,
            node_id=placement.node_rank,
            gpu_id=own[0] if own else None,
            node_ip=node_ip,
            available_gpus=own,
            pid=os.getpid(),
            hostname=socket.gethostname(),
        )
        self._ctx = context.WorkerContext(
            group_key=spec.group_key,
            address=spec.address,
            rank=placement.rank,
            world_size=spec.world_size,
            info=info,
            launcher=launcher,
            env=env,
        )
        context.set_current(self._ctx)
        try:
            cls, args, kwargs = loads_worker_payload(payload)
        except BaseException as exc:
            raise LaunchError(
                f"cannot load the worker class here: {type(exc).__name__}: {exc} "
                f"(is its module importable on this node? classes from __main__ and test modules travel by value)",
                remote_traceback=traceback.format_exc(),
                **self._error_fields("__init__"),
            ) from None
        try:
            with timing.capture_durations():
                self._instance = cls(*args, **kwargs)
        except BaseException as exc:
            raise LaunchError(
                f"constructing {getattr(cls, '__name__', cls)} raised {type(exc).__name__}: {exc}",
                remote_traceback=traceback.format_exc(),
                **self._error_fields("__init__"),
            ) from None
        from .p2p.endpoints import published_endpoints  # imported late: only worker processes listen

        return WorkerRecord(info=info, endpoints=published_endpoints())

    def _set_device_env(self, spec: WorkerSpec, env: dict) -> None:
        """Put this worker's accelerator variables into ``env`` (see ``accelerator``); remember what they replace."""
        from . import accelerator

        placement = spec.placement
        self._saved_env.setdefault(accelerator.WORKER_ACCELERATOR_ENV, os.environ.get(accelerator.WORKER_ACCELERATOR_ENV))
        if not placement.visible_gpu_ids:
            env.update(accelerator.device_env(accelerator.CPU, (), None))
            return
        kind = accelerator.for_node(getattr(spec.node, "accelerator", ""))
        var = kind.visible_devices_env
        if var != "CUDA_VISIBLE_DEVICES":
            env.pop("CUDA_VISIBLE_DEVICES", None)  # a generic default; this kind selects devices otherwise
        self._saved_env.setdefault(var, os.environ.get(var))
        env.update(accelerator.device_env(kind, placement.visible_gpu_ids, self._saved_env[var]))

    # -- calls ------------------------------------------------------------
    def execute(self, method: str, args: tuple, kwargs: dict):
        """Run one method call; never raises for errors in user code.

        Returns the outcome in wire form (``launcher.to_wire``)."""
        with timing.capture_durations() as durations:
            try:
                result = getattr(self._instance, method)(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = self._event_loop().run_until_complete(result)
                return to_wire(CallOutcome(True, result, durations))
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                err = WorkerMethodError(
                    f"{type(exc).__name__}: {exc}",
                    exc_type=type(exc).__name__,
                    remote_traceback=traceback.format_exc(),
                    timestamp=time.time(),
                    **self._error_fields(method),
                )
                err.secondary = bool(getattr(exc, "secondary", False)) and isinstance(exc, CommunicationError)
                err.cause = _picklable(exc)
                return to_wire(CallOutcome(False, err, durations))

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def ping(self) -> int:
        return os.getpid()

    # -- teardown -------------------------------------------------------------
    def release(self) -> None:
        """Let go of everything the worker held, so this process can host another worker.

        For launchers whose processes outlive a group (an MPI rank): stops the
        groups this worker launched, closes its connections and channels, leaves
        a ``torch.distributed`` process group it joined, forgets its identity and
        returns the port it held.  Module state of the user's own code stays.
        """
        from .channel.channel import forget_process_channels
        from .group import stop_launched_groups
        from .p2p.communicator import close_local_communicator

        stop_launched_groups()  # first: the worker object may hold the only reference to them
        self._instance = None
        forget_process_channels()
        close_local_communicator()
        dist = sys.modules.get("torch.distributed")
        if dist is not None:
            try:
                if dist.is_available() and dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
        if self._loop is not None:
            self._loop.close()
            self._loop = None
        if self._held_port is not None:
            self._held_port.close()
            self._held_port = None
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env = {}
        context.set_current(None)
        self._ctx = None
