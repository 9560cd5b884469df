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
import threading
import time
import traceback
from typing import Any, Callable, Optional

from ..base import calls, context, lifecycle, timing
from . import status_server
from ..base.errors import CommunicationError, LaunchError, WorkerMethodError
from ..base.info import WorkerInfo
from ..plugins.launcher import CallOutcome, WorkerRecord, WorkerSpec, to_wire
from ..plugins import node_env
from ..base.serialization import loads_worker_payload
from ..tracing import on_worker_start
from ..base.hooks import hook


def reserve_port(host: str = "") -> tuple[socket.socket, int]:
    """Bind a port chosen by the OS and keep it bound (not listening).

    While the socket is held no other process is handed the port, yet a
    server that binds with ``SO_REUSEADDR`` (as torch's TCPStore does) can
    still take it: no race between choosing a port and using it.  Another
    local user's server could take it the same way, and listen first; that
    only concerns the user's own TCPStore, which authenticates nobody anyway
    (docs/security.md).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock, sock.getsockname()[1]


def _isolated(env: dict) -> bool:
    """``launch(isolate_gpu=True)`` (the default): a worker sees its group's devices on its node, not the whole node's."""
    return env.get("RLINF_ISOLATE_GPU") != "0"


def _picklable(exc: BaseException) -> Optional[BaseException]:
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return None


def async_methods(cls: type, names) -> tuple:
    """The methods among ``names`` that are ``async def`` (the class is then an async worker)."""
    return tuple(n for n in names if inspect.iscoroutinefunction(inspect.getattr_static(cls, n, None))
                 or inspect.iscoroutinefunction(getattr(cls, n, None)))


def _cancel_all_and_stop(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.stop()


class WorkerHost:
    """Owns the user's worker object inside its process.

    A worker class with any ``async def`` method is an *async worker*, as a Ray
    async actor is: its calls run as tasks on one event loop that lives as long
    as the worker, so a second call (``stop()``) runs while a first one
    (``interact()``) awaits, and tasks a call creates keep running between
    calls.  Launchers with their own loop (Ray's async actors) await
    ``execute_async`` on it; others hand calls to ``submit``, which runs them on
    a loop thread owned by this host.  Other workers run one call at a time.
    """

    def __init__(self):
        self._instance: Any = None
        self._ctx: Optional[context.WorkerContext] = None
        self._held_port: Optional[socket.socket] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._loop_thread: Optional[threading.Thread] = None
        self._limit: Optional[asyncio.Semaphore] = None
        self._max_concurrency: Optional[int] = None
        self.is_async = False
        self._saved_env: dict = {}  # device variables as they were before construct, restored by release
        self._added_sys_path: list = []  # ``sys.path`` entries a node group's PYTHONPATH added, removed by release

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
        own = node_env.take(env)  # the node groups' env_configs of this node (see ``plugins.node_env``)
        env["MASTER_PORT"] = str(master_port)
        placement = spec.placement
        self._set_device_env(spec, env)
        if own is not None:
            env = {**self._node_group_env(own, env), **env}  # the launch's own variables win
        os.environ.update(env)
        on_worker_start()  # records from here on if the driver traces (RLINF_TRACE)
        if not placement.visible_gpu_ids:
            own = []
        elif _isolated(env):
            own = placement.device_indices
        else:  # the whole node is visible in its own numbering
            own = list(placement.local_gpu_ids)
        info = WorkerInfo(
            address=spec.address,
            rank=placement.rank,
            node_id=placement.node_rank,
            gpu_id=own[0] if own else None,
            node_ip=node_ip,
            available_gpus=own,
            pid=os.getpid(),
            hostname=socket.gethostname(),
            group_world_size=spec.world_size,
            local_rank=placement.local_rank,
            local_world_size=placement.local_world_size,
            accelerator_type="NV_GPU" if placement.local_gpu_ids else "NO_ACCEL",
            accelerator_rank=placement.local_gpu_ids[0] if placement.local_gpu_ids else -1,
            hardware_infos=list(getattr(placement, "hardware_infos", ())),
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
        self.is_async = bool(spec.async_methods)
        self._max_concurrency = spec.max_concurrency
        from ..base import worker_logging  # after the context: the worker's log lines carry its address

        worker_logging.configure_worker_process()
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
        from ..messaging.p2p.endpoints import published_endpoints  # imported late: only worker processes listen

        return WorkerRecord(info=info, endpoints=published_endpoints(), status=status_server.start(node_ip))

    def _node_group_env(self, own: "node_env.NodeEnv", env: dict) -> dict:
        """The node groups' variables merged with this process's (path-like ones per ``RLINF_PATH_ENV_MERGE_MODE``).

        New ``PYTHONPATH`` entries are also put in front of ``sys.path`` (a process started by the launcher
        with them has them there already; one that was running, as an MPI rank, gets them now); ``release``
        takes them out again.
        """
        values = node_env.merged(own, os.environ, node_env.merge_mode(env, os.environ))
        if "PYTHONPATH" in own.env_vars:
            added = [p for p in node_env.split_paths(values["PYTHONPATH"]) if p not in sys.path]
            sys.path[:0] = added
            self._added_sys_path.extend(added)
        return values

    def _set_device_env(self, spec: WorkerSpec, env: dict) -> None:
        """Put this worker's accelerator variables into ``env`` (see ``accelerator``); remember what they replace."""
        from ..plugins import accelerator

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
        visible = placement.visible_gpu_ids if _isolated(env) else tuple(range(spec.node.num_gpus))
        env.update(accelerator.device_env(kind, visible, self._saved_env[var]))

    # -- calls ------------------------------------------------------------
    @hook("run")
    def execute(self, method: str, args: tuple, kwargs: dict):
        """Run one method call; never raises for errors in user code.

        Returns the outcome in wire form (``launcher.to_wire``).  For an async
        worker, blocks the calling thread until the call's task on the worker's
        loop is done (other calls keep running on that loop meanwhile)."""
        if self.is_async:  # waits as long as the user's method runs, like any call
            return asyncio.run_coroutine_threadsafe(self.execute_async(method, args, kwargs), self._own_loop()).result()
        call = calls.begin(method)
        with timing.capture_durations() as durations:
            try:
                result = getattr(self._instance, method)(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = self._event_loop().run_until_complete(result)
                return to_wire(CallOutcome(True, result, durations))
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt) or (isinstance(exc, SystemExit) and not self._catch_failure()):
                    raise
                return self._failure(method, exc, durations)
            finally:
                calls.end(call)

    @hook("run_async")
    async def execute_async(self, method: str, args: tuple, kwargs: dict):
        """``execute`` as a task on the running loop: concurrent with the worker's other calls."""
        limit = self._concurrency_limit()
        if limit is not None:
            await limit.acquire()  # a slot frees when one of this worker's running calls returns (max_concurrency)
        call = calls.begin(method)
        try:
            with timing.capture_durations() as durations:
                try:
                    result = getattr(self._instance, method)(*args, **kwargs)
                    if inspect.isawaitable(result):
                        result = await result
                    return to_wire(CallOutcome(True, result, durations))
                except BaseException as exc:
                    if isinstance(exc, KeyboardInterrupt) or (isinstance(exc, SystemExit) and not self._catch_failure()):
                        raise
                    return self._failure(method, exc, durations)
        finally:
            calls.end(call)
            if limit is not None:
                limit.release()

    def submit(self, method: str, args: tuple, kwargs: dict, on_done: Callable[[Any], None]) -> None:
        """Start a call of an async worker on the host's loop thread; ``on_done(wire)`` gets its outcome.

        For launchers that run calls on one thread of their own (MPI): the call
        does not block it, so the next call can start while this one awaits."""
        future = asyncio.run_coroutine_threadsafe(self.execute_async(method, args, kwargs), self._own_loop())

        def done(fut):
            try:
                wire = fut.result()
            except BaseException as exc:  # cancelled as the worker was released
                wire = self._failure(method, exc, {})
            on_done(wire)

        future.add_done_callback(done)

    def _failure(self, method: str, exc: BaseException, durations: dict):
        err = WorkerMethodError(
            f"{type(exc).__name__}: {exc}",
            exc_type=type(exc).__name__,
            remote_traceback=traceback.format_exc() if exc is sys.exc_info()[1] else "".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__)),
            timestamp=time.time(),
            **self._error_fields(method),
        )
        err.secondary = bool(getattr(exc, "secondary", False)) and isinstance(exc, CommunicationError)
        err.cause = _picklable(exc)
        if not err.secondary:  # said here as it happens, whether or not anyone waits on the call
            from ..base.worker_logging import report_call_failure

            report_call_failure(err)
        return to_wire(CallOutcome(False, err, durations))

    def _catch_failure(self) -> bool:
        """RLinf's ``catch_system_failure``: report ``SystemExit`` in a call instead of exiting (default)."""
        env = self._ctx.env if self._ctx is not None else {}
        return env.get("RLINF_CATCH_FAILURE", "1") not in ("0", "false", "False")

    def _concurrency_limit(self) -> Optional[asyncio.Semaphore]:
        if self._max_concurrency is None:
            return None
        if self._limit is None:  # made on the loop that runs the calls
            self._limit = asyncio.Semaphore(self._max_concurrency)
        return self._limit

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def _own_loop(self) -> asyncio.AbstractEventLoop:
        """The async worker's loop, running in a thread of this host (started on first use)."""
        if self._loop_thread is None:
            loop = self._event_loop()
            ready = threading.Event()

            def run():
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            self._loop_thread = threading.Thread(target=run, name="rlinf-worker-loop", daemon=True)
            self._loop_thread.start()
            ready.wait(10)  # bounded: the loop thread only has to start
        return self._loop

    def ping(self) -> int:
        return os.getpid()

    # -- teardown -------------------------------------------------------------
    def release(self) -> None:
        """Let go of everything the worker held, so this process can host another worker.

        For launchers whose processes outlive a group (an MPI rank): stops the
        groups this worker launched, closes its channels and connections (each layer registered its part
        with ``lifecycle``), leaves
        a ``torch.distributed`` process group it joined, forgets its identity and
        returns the port it held.  Module state of the user's own code stays.
        """
        lifecycle.release_start()  # the groups it launched stop: the worker object may hold the only reference
        status_server.stop()
        calls.forget()
        self._instance = None
        lifecycle.release()  # channels, then the connections under them
        dist = sys.modules.get("torch.distributed")
        if dist is not None:
            try:
                if dist.is_available() and dist.is_initialized():
                    dist.destroy_process_group()
            except Exception:
                pass
        if self._loop is not None:
            if self._loop_thread is not None:
                self._loop.call_soon_threadsafe(_cancel_all_and_stop, self._loop)
                self._loop_thread.join(10)  # bounded: a task that ignores cancellation is left behind
                self._loop_thread = None
            if not self._loop.is_running():
                self._loop.close()
            self._loop = None
        self._limit = None
        if self._held_port is not None:
            self._held_port.close()
            self._held_port = None
        for name, value in self._saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        self._saved_env = {}
        for entry in self._added_sys_path:
            if entry in sys.path:
                sys.path.remove(entry)
        self._added_sys_path = []
        context.set_current(None)
        self._ctx = None
