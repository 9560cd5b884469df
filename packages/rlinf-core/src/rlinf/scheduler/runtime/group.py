"""``WorkerGroup``: many workers of one class, called as one.

``group.method(...)`` submits the call to every selected worker and returns a
``WorkerGroupFuncResult`` at once.  Launch validates everything it can
(placement, name, picklability) before any process starts.

A worker method always wins over a group helper of the same name: on a
launched group whose workers define ``stop``, ``group.stop()`` calls theirs
(RLinf runners stop env workers so).  The helper itself stays reachable
through the class: ``WorkerGroup.stop(group)``.
"""

from __future__ import annotations

import os
import time
import weakref
from typing import Any, Optional

from ..base import config, context, lifecycle
from ..plugins import watch
from ..base.address import WorkerAddress, describe_running, validate_group_name
from .cluster import Cluster, is_ended, on_shutdown
from ..base.errors import GroupNameError, LaunchError, WorkerDiedError, WorkerError, WorkerMethodError
from .host import async_methods
from ..plugins.launcher import GroupRecord, LauncherSession, Rejected, WorkerRecord, WorkerSpec
from ..plugins.placement import PlacementStrategy, default_placement
from ..plugins import get_registry
from ..plugins import node_env
from ..base.serialization import dumps_worker_payload, ship_run_time_modules_by_value
from ..base.unpicklable import RETURN_UNPICKLABLE, find_unpicklable, unpicklable_error
from ..tracing import collect
from ..base.hooks import hook
from .group_result import WorkerGroupFuncResult


#: groups launched by this process and not stopped yet
_launched: "weakref.WeakSet[WorkerGroup]" = weakref.WeakSet()


@collect.group_source
def _running_groups(session) -> dict:
    """The groups this process launched in ``session`` and has not stopped (for the timeline's collector)."""
    return {g._name: (list(g._handles), list(g._records)) for g in list(_launched)
            if g._session is session and g._name is not None}


#: why the groups of a session that ended with ``Cluster.shutdown`` are not running any more
SHUT_DOWN = "ended by cluster.shutdown()"


@on_shutdown
def end_groups_of(session) -> None:
    """The groups this process launched in ``session`` ended with it (``Cluster.shutdown``): calling one
    says so, instead of reaching for processes that are gone.  (A group attached by name finds out at
    its next call: ``_require_launched``.)"""
    for group in list(_launched):
        if group._session is session:
            group._end(SHUT_DOWN)


@lifecycle.on_release_start
def stop_launched_groups() -> None:
    """Stop every group this process launched (its worker is being released)."""
    for group in list(_launched):
        try:
            WorkerGroup.stop(group)  # the group's own stop, even if its workers define one
        except Exception:
            pass


class _MethodCaller:
    __slots__ = ("_group", "_name")

    def __init__(self, group: "WorkerGroup", name: str):
        self._group = group
        self._name = name

    def __call__(self, *args, **kwargs) -> WorkerGroupFuncResult:
        return self._group._call(self._name, args, kwargs)

    def __repr__(self):
        return f"<group method {self._group.worker_group_name}.{self._name}>"


def _public_methods(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n, None))}


class WorkerGroup:
    """A group of workers of one class, launched together.

    Made with ``WorkerClass.create_group(...)``; calling a method of the worker
    class on the launched group runs it on every worker (or the ranks chosen
    with ``execute_on``) and returns a ``WorkerGroupFuncResult``.

    Args:
        worker_cls: the ``Worker`` subclass.
        args: positional arguments for each worker's ``__init__``.
        kwargs: keyword arguments for each worker's ``__init__``.
    """

    def __init__(self, worker_cls: type, args: tuple = (), kwargs: Optional[dict] = None):
        self._cls = worker_cls
        self._args = args
        self._kwargs = kwargs or {}
        self._methods = _public_methods(worker_cls)
        self._session: Optional[LauncherSession] = None
        self._handles: list = []
        self._records: list[WorkerRecord] = []
        self._name: Optional[str] = None
        self._ended: Optional[str] = None  # why a launched group is not running any more
        self._selection: Optional[list[int]] = None
        self._cluster: Optional[Cluster] = None

    # -- launch -------------------------------------------------------------
    def launch(
        self,
        cluster: Optional[Cluster] = None,
        placement_strategy: Optional[PlacementStrategy] = None,
        name: Optional[str] = None,
        max_concurrency: Optional[int] = None,
        isolate_gpu: bool = True,
        catch_system_failure: Optional[bool] = None,
        timeout: Optional[float] = None,
    ) -> "WorkerGroup":
        """Start one worker per placement; every keyword RLinf's ``launch`` takes is honoured.

        Args:
            cluster: where to launch (default: ``Cluster()``).
            placement_strategy: where each worker goes (default: one worker per accelerator, or one on node 0).
            name: the group's name, unique in the cluster (default: from the class name).
            max_concurrency: most calls one worker runs at once (async workers:
                default 1000, as Ray's async actors; others: 1).
            isolate_gpu: each worker sees its group's accelerators on its node, its
                own at index ``LOCAL_RANK``; False: all of its node's, in the node's numbering.
            catch_system_failure: a ``SystemExit`` in a call is that call's error
                (default: ``RLINF_CATCH_FAILURE``, else True); False: it ends the worker.
            timeout: seconds the launch may take (default ``RLINF_LAUNCH_TIMEOUT``).

        Raises:
            GroupNameError: a group of that name is running.
            LaunchError: a worker failed to start, or the launcher cannot run this class's calls.
            TypeError: a wrongly typed argument, or a class/arguments that cannot be sent.
            ValueError: a bad ``max_concurrency`` or placement.
            RuntimeError: the group is launched already.

        Example:
            ```python
            group = Actor.create_group(cfg).launch(cluster, PackedPlacementStrategy(0, 7), name="actor")
            print(group.train(batch).wait(timeout=600))  # every wait bounded
            ```
        """
        if self._session is not None:
            raise RuntimeError(f"group {self._name!r} is already launched")
        if max_concurrency is not None and (isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int)
                                            or max_concurrency < 1):
            raise ValueError(f"max_concurrency must be a positive int or None, got {max_concurrency!r}")
        if not isinstance(isolate_gpu, bool):
            raise TypeError(f"isolate_gpu must be a bool, got {isolate_gpu!r}")
        if catch_system_failure is not None and not isinstance(catch_system_failure, bool):
            raise TypeError(f"catch_system_failure must be a bool or None, got {catch_system_failure!r}")
        timeout = config.check_timeout(timeout)
        if cluster is None:
            cluster = Cluster()
        elif not isinstance(cluster, Cluster):
            raise TypeError(f"cluster must be a Cluster, got {type(cluster).__name__}")
        if placement_strategy is not None and not isinstance(placement_strategy, PlacementStrategy):
            raise TypeError(f"placement_strategy must be a PlacementStrategy, got {placement_strategy!r}")
        parent = context.current()
        if name is None and parent is not None:
            key, base = parent.address.get_name(), parent.address  # a child group of this worker
        else:
            key = validate_group_name(name if name is not None else f"Worker_group_{self._cls.__name__}")
            base = WorkerAddress(key)
        strategy = placement_strategy or default_placement(cluster.nodes)
        placements = strategy.get_placement(cluster.nodes)
        coroutines = async_methods(self._cls, sorted(self._methods))
        # what the launcher must offer (its session's ``concurrency``): calls as tasks on one
        # loop for async workers, calls on several threads for sync workers with max_concurrency > 1
        need = "async" if coroutines else ("threads" if (max_concurrency or 1) > 1 else None)
        if need is not None and need not in getattr(cluster.session, "concurrency", ()):
            what = f"has async methods {list(coroutines)}" if coroutines else f"asks for max_concurrency={max_concurrency}"
            raise LaunchError(
                f"worker class {self._cls.__name__} {what}, but the {cluster.launcher_name!r} launcher cannot run "
                f"its calls concurrently ({'async workers' if coroutines else 'threaded calls'} are not supported there)",
                group=name,
            )
        try:
            payload = dumps_worker_payload(self._cls, self._args, self._kwargs)
        except Exception as exc:
            raise TypeError(
                f"cannot send worker class {self._cls.__name__} and its arguments to the workers of group "
                f"{key!r}: {type(exc).__name__}: {exc}"
            ) from exc
        labels = getattr(strategy, "node_group_labels", None)  # placed through these node groups: their env only
        node_envs = {r: node_env.for_node(cluster.cluster_config, r, labels) for r in {p.node_rank for p in placements}}
        session = cluster.session
        try:
            session.reserve_group(key)
        except GroupNameError:
            raise GroupNameError(
                f"a group named {key!r} is already running in this cluster; pass name= to launch() "
                f"to give this one another name"
            ) from None
        nodes = {n.node_rank: n for n in cluster.nodes}
        master_addr = nodes[placements[0].node_rank].ip
        plugin_sources = get_registry().sources_json()
        # RLINF_* settings of the launching process apply to its workers too
        forwarded = {k: v for k, v in os.environ.items() if k.startswith("RLINF_") and k not in config.WORKER_ONLY_ENV}
        specs = []
        for p in placements:
            # the node groups' env_configs of the worker's node: over the forwarded settings, under the launch's own
            found = node_envs[p.node_rank]
            env = {
                **({k: v for k, v in forwarded.items() if k not in found.env_vars} if found else forwarded),
                "MASTER_ADDR": master_addr,
                "RANK": str(p.rank),
                "LOCAL_RANK": str(p.local_rank),
                "WORLD_SIZE": str(len(placements)),
                "LOCAL_WORLD_SIZE": str(p.local_world_size),
                "NODE_RANK": str(p.node_rank),
                config.PLUGIN_SOURCES_ENV: plugin_sources,
            }
            if catch_system_failure is not None:
                env["RLINF_CATCH_FAILURE"] = "1" if catch_system_failure else "0"
            if p.local_gpu_ids and not isolate_gpu:  # the host then shows the whole node's devices
                env["RLINF_ISOLATE_GPU"] = "0"
            if found is not None:
                env[node_env.NODE_ENV_KEY] = found.to_json()
            specs.append(
                WorkerSpec(key, base.get_child_address(p.rank), len(placements), p, nodes[p.node_rank], env,
                           self._cls.__name__, tuple(sorted(self._methods)), coroutines, max_concurrency)
            )
        try:
            started = session.start_workers(specs, payload, timeout or config.launch_timeout())
            self._handles = [h for h, _ in started]
            self._records = [r for _, r in started]
            session.register_group(GroupRecord(key, self._cls.__name__, self._records, session.launcher_name))
        except BaseException:
            session.release_group(key)
            raise
        self._session, self._name, self._cluster = session, key, cluster
        self._ended = None
        _launched.add(self)
        return self

    @classmethod
    def from_group_name(cls, worker_class: type, group_name: str, cluster: Optional[Cluster] = None) -> "WorkerGroup":
        """Attach to the running group ``group_name`` of ``worker_class``.

        The group may have been launched by this process (whose handle was
        dropped: groups live until stopped) or by another process of the
        cluster, a worker say.  The result calls the same workers;
        ``stop()`` on it stops the group for everyone.

        Args:
            worker_class: the group's worker class.
            group_name: the running group's name.
            cluster: its cluster (default: ``Cluster()``).

        Raises:
            GroupNameError: no group of that name is running.
            TypeError: the group runs another class, or ``cluster`` is not a ``Cluster``.
        """
        if not isinstance(worker_class, type):
            raise TypeError(f"worker_class must be a class, got {worker_class!r}")
        validate_group_name(group_name)
        if cluster is None:
            cluster = Cluster()
        elif not isinstance(cluster, Cluster):
            raise TypeError(f"cluster must be a Cluster, got {type(cluster).__name__}")
        session = cluster.session
        record = session.lookup_group(group_name)
        handles = session.attach_group(group_name) if record is not None else None
        if record is None or handles is None:
            raise GroupNameError(
                f"no group named {group_name!r} is running in this cluster (running: "
                f"{describe_running(session.list_groups())})"
            )
        if record.class_name != worker_class.__name__:
            raise TypeError(
                f"group {group_name!r} runs workers of class {record.class_name}, not {worker_class.__name__}"
            )
        group = cls(worker_class)
        group._session, group._name, group._cluster = session, group_name, cluster
        group._handles, group._records = list(handles), list(record.workers)
        return group

    # -- attributes -----------------------------------------------------------
    @property
    def worker_group_name(self) -> Optional[str]:
        """The group's name in the cluster; None before ``launch``."""
        return self._name

    @property
    def world_size(self) -> int:
        """How many workers the group has (0 before ``launch``)."""
        return len(self._records)

    @property
    def worker_info_list(self):
        """The ``WorkerInfo`` of each worker, in rank order."""
        return [r.info for r in self._records]

    @property
    def worker_cls(self) -> type:
        """The group's worker class."""
        return self._cls

    worker_cls_name = property(lambda self: self._cls.__name__, doc="The worker class's name (RLinf's).")

    def execute_on(self, *ranks: int) -> "WorkerGroup":
        """Run the next call on these ranks only; returns the group, for chaining.

        Args:
            *ranks: ranks (ints, or lists/tuples of them), each ``0 .. world_size - 1``.

        Raises:
            ValueError: no rank, or one out of range.
            RuntimeError: the group is not launched, or stopped.
        """
        self._require_launched()
        flat: list[int] = []
        for r in ranks:
            flat.extend(r if isinstance(r, (list, tuple)) else [r])
        if not flat:
            raise ValueError("execute_on() needs at least one rank")
        size = len(self._records)
        for r in flat:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < size:
                raise ValueError(
                    f"execute_on: rank {r!r} is out of range for group {self._name!r} of {size} worker(s)"
                )
        self._selection = flat
        return self

    # -- calls ----------------------------------------------------------------
    def __getattribute__(self, name: str):
        # A worker method wins over a group helper of the same name once the group runs
        # (``group.stop()`` calls the workers' ``stop``); see ``_CONTROLS``.
        if name in _CONTROLS:
            d = object.__getattribute__(self, "__dict__")
            if d.get("_session") is not None and name in d.get("_methods", ()):
                return _MethodCaller(self, name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(
                f"{name!r} is private to {self.__dict__.get('_cls', type(None)).__name__}: methods whose names start "
                f"with '_' are not exposed on a worker group"
            )
        if name not in self.__dict__.get("_methods", ()):
            raise AttributeError(f"worker class {self._cls.__name__} has no public method {name!r}")
        return _MethodCaller(self, name)

    def __dir__(self):
        return sorted(set(super().__dir__()) | self._methods)

    def _require_launched(self) -> LauncherSession:
        """The group's session, read once (a stop or a shutdown in another thread may end it meanwhile)."""
        session = self._session
        if session is not None and is_ended(session):
            self._end(SHUT_DOWN)
            session = None
        if session is None:
            if self._ended is not None:
                raise RuntimeError(f"worker group {self._name!r} of {self._cls.__name__} is not launched any more: "
                                   f"it was {self._ended}")
            raise RuntimeError(f"worker group of {self._cls.__name__} is not launched: call .launch(cluster) first")
        return session

    def _running(self) -> bool:
        """Launched, and neither stopped nor ended with its cluster."""
        session = self._session
        return session is not None and not is_ended(session)

    def _end(self, why: str) -> None:
        _launched.discard(self)
        self._session = None
        self._ended = why

    @hook("group_call")
    def _call(self, method: str, args: tuple, kwargs: dict) -> WorkerGroupFuncResult:
        session = self._require_launched()
        ranks = self._selection if self._selection is not None else list(range(len(self._handles)))
        self._selection = None
        ship_run_time_modules_by_value()  # arguments of a test module's classes: the workers cannot import it
        submit = session.submit
        try:
            calls = [submit(self._handles[r], method, args, kwargs) for r in ranks]
        except Exception as exc:  # the first submission pickles the arguments: nothing was started
            found = find_unpicklable(args, "args") or find_unpicklable(kwargs, "kwargs")
            if found is None:
                raise
            raise unpicklable_error(f"the arguments of {self._name}.{method}()", found[1], exc, found[0]) from exc
        return WorkerGroupFuncResult(self, method, ranks, calls, session)

    def _rejected(self, rank: int, method: str, rejected: Rejected) -> WorkerError:
        info = self._records[rank].info
        ran = rejected.reason.startswith(RETURN_UNPICKLABLE)  # the return value did not pickle
        return WorkerMethodError(
            rejected.reason if ran else f"the call could not start in the worker: {rejected.reason}",
            group=self._name, rank=rank, node=info.node_id, node_ip=info.node_ip, method=method, pid=info.pid,
            remote_traceback=rejected.traceback or None, timestamp=time.time(),
        )

    def _death(self, rank: int, method: str, reason: Any, submitted: float) -> Optional[str]:
        """Note that ``rank`` was found dead by a call submitted at ``submitted`` (monotonic); return how an
        earlier call found it dead if that was before this call was made (it was dead already), else None."""
        deaths = self.__dict__.setdefault("_deaths", {})  # rank -> (monotonic, wall clock, method, reason)
        earlier = deaths.get(rank)
        if earlier is None:
            deaths[rank] = (time.monotonic(), time.time(), method, reason)
            return None
        if earlier[0] >= submitted:
            return None
        when = time.strftime("%H:%M:%S", time.localtime(earlier[1]))
        return f"it died at {when} while running {earlier[2]!r} ({earlier[3]})"

    def _died(self, rank: int, method: str, reason: Any, submitted: Optional[float] = None) -> WorkerError:
        if isinstance(reason, WorkerError):
            return reason
        info = self._records[rank].info
        earlier = self._death(rank, method, reason, time.monotonic() if submitted is None else submitted)
        return WorkerDiedError(
            f"the worker process was already dead when {method!r} was called: {earlier}" if earlier else
            f"the worker process died at {time.strftime('%H:%M:%S')} ({reason})",
            group=self._name,
            rank=rank,
            node=info.node_id,
            node_ip=info.node_ip,
            method=method,
            pid=info.pid,
            timestamp=time.time(),
        )

    # -- teardown ---------------------------------------------------------------
    def _close(self) -> None:
        """RLinf's ``WorkerGroup._close()``: the same as ``stop()`` (RLinf programs and benchmarks call it)."""
        WorkerGroup.stop(self)

    @hook("group_stop")
    def stop(self) -> None:
        """Stop this group's workers and free its name."""
        session = self._session
        if session is None:
            return
        if is_ended(session):  # its processes ended with the cluster
            self._end(SHUT_DOWN)
            return
        _launched.discard(self)
        try:
            session.stop_workers(self._handles)
        finally:
            session.release_group(self._name)
            self._end("stopped")

    def __repr__(self):
        state = f"{len(self._records)} workers" if self._session else "not launched"
        return f"<WorkerGroup {self._name or self._cls.__name__}: {state}>"


#: the group's own public attributes (controls); a worker method of the same name shadows them
#: on a launched group, and ``WorkerGroup.<name>`` on the class still reaches the control
_CONTROLS = frozenset(n for n in dir(WorkerGroup) if not n.startswith("_"))
