"""Ray sessions: start or join a Ray cluster and run worker groups as actors.

Each group gets one placement group with one bundle per worker, each bundle
pinned to its node by node-id label, so a placement that the cluster cannot
host fails as a whole instead of half-starting.  Accelerators are assigned
by core (``CUDA_VISIBLE_DEVICES``), not by Ray, so the strategy decides
exactly which device each worker sees.

Lifetime: a group lives until it is stopped, whether or not the code that
launched it keeps its ``WorkerGroup``.  Its actors are owned by the process
that launched it (the driver, or a worker for a child group) and the session
and the registry hold their handles, so Ray does not collect them; stopping
the group kills them and removes the placement group, which frees its
resources at once.  ``Cluster.shutdown()`` stops every group the process
launched; if the driver exits without it, or is killed, Ray ends the actors
and placement groups it owns (fate sharing with the owner), on an embedded
cluster and on an external ``ray start`` cluster alike.  Nothing is detached,
so no group outlives its driver.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from rlinf.scheduler.base import config, progress
from rlinf.scheduler.plugins import watch
from rlinf.scheduler.base.errors import GroupNameError, LaunchError, WorkerError
from rlinf.scheduler.plugins.launcher import CallOutcome, Died, Failed, GroupRecord, Launcher, LauncherSession, PendingCall, Rejected, from_wire
from rlinf.scheduler.plugins.placement import NodeInfo

from . import embedded, exits, logs, loopback
from .classes import share_class_tracker
from .runtime_env import worker_runtime_env

#: fraction of a CPU each worker's bundle reserves (workers mostly wait)
WORKER_CPU = 0.01
NODE_LABEL = "ray.io/node-id"
#: seconds per blocking wait slice while collecting results
_SLICE = 1.0
#: seconds a registry request may take (the registry actor answers at once unless it is gone)
_REGISTRY_TIMEOUT = 60.0


def _prepare_environment(address: Optional[str]) -> None:
    """Settings that must be in place before ``import ray`` for a loopback-only local cluster."""
    loopback.follow(address)  # Ray takes loopback for this node's address only for a loopback cluster
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not address and not os.environ.get("RAY_AUTH_MODE") and not os.environ.get("RAY_AUTH_TOKEN"):
        # token auth without writing ~/.ray: the token lives in this process tree's environment.  The mode
        # is said explicitly, as Ray would set it itself: Ray then does not warn that it turned token auth
        # on by default and invite the user to turn it off
        os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(24)
        os.environ["RAY_AUTH_MODE"] = "token"
        if "ray" in sys.modules:  # a program that imported Ray first: Ray read the mode then; have it read again
            _reread_ray_config()
    if not (logs.is_tty(sys.stdout) and logs.is_tty(sys.stderr)):  # worker lines (printed to the driver's stdout
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")  # and stderr) go to a file or a pipe: no colour codes there


def _reread_ray_config() -> None:
    """Make an already imported Ray read its settings (RAY_AUTH_MODE) from the environment again, as Ray
    itself does when it turns token authentication on for a local cluster."""
    try:
        from ray._raylet import Config
    except ImportError:  # a Ray without it reads the mode at ray.init
        return
    Config.initialize("")


def _ray_resource(node: NodeInfo) -> str:
    """The Ray resource that counts this node's accelerators (``"GPU"``, ``"NPU"``, ...)."""
    from rlinf.scheduler.plugins import accelerator

    return accelerator.get(node.accelerator).ray_resource if node.accelerator else "GPU"


@dataclass
class RayHandle:
    actor: Any
    rank: int


class RayCall(PendingCall):
    __slots__ = ("ref",)

    def __init__(self, ref):
        self.ref = ref

    def done(self) -> bool:
        import ray

        ready, _ = ray.wait([self.ref], timeout=0, fetch_local=False)
        return bool(ready)


def _ray_node_order(nodes: list[dict]) -> list[dict]:
    """Head node first, then by address and id: the same order in every process."""
    alive = [n for n in nodes if n.get("Alive")]
    return sorted(
        alive,
        key=lambda n: ("node:__internal_head__" not in n.get("Resources", {}), n["NodeManagerAddress"], n["NodeID"]),
    )


def _ray_session_id(ray) -> Optional[str]:
    """The directory of the Ray session this process is connected to (a new one after each ``ray.init``)."""
    try:
        return ray._private.worker._global_node.get_session_dir_path()
    except Exception:  # not connected, or a Ray without it: the connection's identity is unknown
        try:
            return ray.get_runtime_context().get_job_id()
        except Exception:
            return None


class RaySession(LauncherSession):
    #: async workers run as Ray async actors; sync workers with max_concurrency > 1 as threaded actors
    concurrency = ("async", "threads")

    def __init__(self, owns_cluster: bool):
        import ray

        from .registry import get_or_create_registry, get_registry

        # results and arguments keep the driver's classes; done here, not at import: importing this module
        # imports nothing of Ray, whose settings (RAY_AUTH_MODE) are read when it is imported
        share_class_tracker()
        self._ray = ray
        self._owns_cluster = owns_cluster
        self.nodes_can_join = not owns_cluster  # an embedded cluster is this machine alone
        self._registry = get_or_create_registry() if owns_cluster or not self._in_worker() else get_registry()
        # group name -> (actor handles, placement group), for groups launched here and not stopped
        self._groups: dict[str, tuple] = {}
        self._nodes_cache: Optional[list[NodeInfo]] = None
        self.watchdog = None  # the process that cleans up if this driver is killed
        self._ray_session = _ray_session_id(ray)  # which ``ray.init`` this session lives in (``connected``)
        logs.install()  # in a driver that takes its workers' lines: a call's lines print before its results

    @staticmethod
    def _in_worker() -> bool:
        from rlinf.scheduler.base import context

        return context.current() is not None

    # -- nodes ------------------------------------------------------------------
    @property
    def nodes(self) -> list[NodeInfo]:
        if self._nodes_cache is None:
            ordered = _ray_node_order(self._ray.nodes())
            from rlinf.scheduler.plugins import accelerator

            kinds = [accelerator.for_resources(n.get("Resources", {})) for n in ordered]
            self._nodes_cache = [
                NodeInfo(
                    node_rank=i,
                    ip=n["NodeManagerAddress"],
                    num_gpus=int(n.get("Resources", {}).get(k.ray_resource, 0)) if k else 0,
                    node_id=n["NodeID"],
                    hostname=n.get("NodeManagerHostname", ""),
                    accelerator=k.name if k else "",
                )
                for i, (n, k) in enumerate(zip(ordered, kinds))
            ]
        return self._nodes_cache

    def refresh_nodes(self) -> None:
        self._nodes_cache = None

    # -- registry -----------------------------------------------------------------
    def reserve_group(self, name: str) -> None:
        if not self._ray.get(self._registry.reserve.remote(name), timeout=_REGISTRY_TIMEOUT):
            raise GroupNameError(f"group name {name!r} is taken")

    def register_group(self, record: GroupRecord) -> None:
        launched = self._groups.get(record.name)
        self._ray.get(self._registry.register.remote(record, launched), timeout=_REGISTRY_TIMEOUT)

    def release_group(self, name: str) -> None:
        """Forget the group and remove its placement group, wherever it was launched."""
        local = self._groups.pop(name, None)
        try:
            remote = self._ray.get(self._registry.release.remote(name), timeout=_REGISTRY_TIMEOUT)
        except Exception:
            remote = None  # the registry dies with the driver, and with it every placement group
        for launched in {id(x): x for x in (local, remote) if x is not None}.values():
            self._free(launched)

    def _free(self, launched) -> None:
        from ray.util.placement_group import remove_placement_group

        actors, pg = launched
        for actor in actors:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:
                pass  # already gone
        try:
            remove_placement_group(pg)
        except Exception:
            pass  # already removed (by whoever stopped the group first)

    def publish_cluster(self, info: dict) -> dict:
        return self._ray.get(self._registry.set_cluster.remote(info), timeout=_REGISTRY_TIMEOUT)

    def published_cluster(self) -> Optional[dict]:
        return self._ray.get(self._registry.cluster.remote(), timeout=_REGISTRY_TIMEOUT)

    def attach_group(self, name: str) -> Optional[list]:
        """Handles, rank order, on the workers of the running group ``name`` (None if not running)."""
        launched = self._ray.get(self._registry.resources.remote(name), timeout=_REGISTRY_TIMEOUT)
        if launched is None:
            return None
        return [RayHandle(actor, rank) for rank, actor in enumerate(launched[0])]

    def lookup_group(self, name: str) -> Optional[GroupRecord]:
        return self._registry_answer(self._registry.lookup.remote(name))

    def list_groups(self) -> list[str]:
        return self._registry_answer(self._registry.names.remote())

    def _registry_answer(self, ref):
        """The registry's answer to ``ref``.  Called from an async worker's event loop (its first send to a
        peer group, or first use of a channel, in an ``async def`` method), the wait is a registry round trip
        (about a millisecond, once per group: the answer is cached), taken through the reference's future, so
        that Ray does not warn about a blocking ``ray.get`` inside an async actor, a warning meant for long
        waits (Ray gives it for any ``ray.get`` in an async actor, on any thread)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop runs in this thread: the plain call
            return self._ray.get(ref, timeout=_REGISTRY_TIMEOUT)
        return ref.future().result(timeout=_REGISTRY_TIMEOUT)

    # -- workers --------------------------------------------------------------------
    def start_workers(self, specs, payload, timeout):
        ray = self._ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from .actor import actor_class, actor_max_concurrency

        bundles, selectors = [], []
        for spec in specs:
            bundle = {"CPU": WORKER_CPU}
            if spec.placement.local_gpu_ids:
                bundle[_ray_resource(spec.node)] = len(spec.placement.local_gpu_ids)
            bundles.append(bundle)
            selectors.append({NODE_LABEL: spec.node.node_id})
        group = specs[0].group_key
        # the node groups' env_configs of each worker's node: env_vars and py_executable of its actor
        local_node = ray.get_runtime_context().get_node_id()
        runtime_envs = [worker_runtime_env(spec, local_node) for spec in specs]
        pg = placement_group(bundles, strategy="PACK", bundle_label_selector=selectors)
        actors = []
        line = progress.Progress()
        try:
            # the actors and their construct calls are submitted at once: Ray starts each as soon as its
            # bundle is reserved, so no round trip waits for the reservation before the first worker starts
            is_async = bool(specs[0].async_methods)
            remote_cls = actor_class(specs[0].class_name, specs[0].methods, is_async)
            for i, spec in enumerate(specs):
                options = {"runtime_env": runtime_envs[i]} if runtime_envs[i] else {}
                actors.append(
                    remote_cls.options(
                        num_cpus=WORKER_CPU,
                        max_concurrency=actor_max_concurrency(is_async, spec.max_concurrency),
                        scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                        **options,
                    ).remote()
                )
            port_ref = actors[0]._rlinf_reserve_master_port.remote()
            refs = [a._rlinf_construct.remote(spec, payload, port_ref) for a, spec in zip(actors, specs)]
            self._wait_for_resources(pg, specs, bundles, timeout, line)
            records = self._collect_launch(refs, specs, timeout, line)
        except BaseException:
            line.close()
            for a in actors:
                ray.kill(a, no_restart=True)
            remove_placement_group(pg)
            raise
        line.close(f"group {group}: {len(specs)} worker(s) started")
        self._groups[group] = (actors, pg)  # held until stopped: Ray ends actors nobody holds
        return [(RayHandle(a, s.placement.rank), r) for a, s, r in zip(actors, specs, records)]

    def _wait_for_resources(self, pg, specs, bundles, timeout, line) -> None:
        """Wait (in slices, saying what for) until the placement group is reserved; ``LaunchError`` after ``timeout``."""
        ray = self._ray
        deadline = time.monotonic() + timeout
        need: dict = {}
        for b in bundles:
            for k, v in b.items():
                need[k] = need.get(k, 0) + v
        reserved = pg.ready()  # one check task, waited on in slices
        while True:
            ready, _ = ray.wait([reserved], timeout=max(0.0, min(_SLICE, deadline - time.monotonic())))
            if ready:
                return
            if time.monotonic() >= deadline:
                raise LaunchError(
                    f"the cluster could not reserve resources {bundles} on nodes "
                    f"{[s.node.node_rank for s in specs]} within {timeout:.0f} s",
                    group=specs[0].group_key,
                )
            if line.elapsed >= 1.0:  # Ray's view of free resources costs a request: only for waits that last
                free = ray.available_resources()
                have = ", ".join(f"{k} {free.get(k, 0):g} free of {v:g} needed" for k, v in need.items())
                line.update(f"group {specs[0].group_key}: waiting for resources on node(s) "
                            f"{sorted({s.node.node_rank for s in specs})}: {have} (cluster-wide)")

    def _collect_launch(self, refs, specs, timeout, line):
        ray = self._ray
        deadline = time.monotonic() + timeout
        spec_of = dict(zip(refs, specs))
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1,
                                      timeout=max(0.0, min(_SLICE, deadline - time.monotonic())))
            line.update(f"group {specs[0].group_key}: {len(refs) - len(pending)} of {len(refs)} worker(s) started")
            if not ready and time.monotonic() < deadline:
                continue
            if not ready:
                ranks = [spec_of[r].placement.rank for r in pending]
                raise LaunchError(f"workers did not start within {timeout:.0f} s (ranks {ranks})", group=specs[0].group_key)
            for ref in ready:
                spec = spec_of[ref]
                try:
                    ray.get(ref)
                except Exception as exc:
                    raise self._launch_error(exc, spec) from None
        needs: list = []
        records = logs.strip_all(ray.get(refs), needs)
        logs.wait(needs)
        return records

    def _launch_error(self, exc, spec) -> WorkerError:
        from ray.exceptions import RayTaskError

        cause = getattr(exc, "cause", None) if isinstance(exc, RayTaskError) else None
        if isinstance(cause, WorkerError):
            return cause
        return LaunchError(
            f"the worker process failed to start: {type(exc).__name__}: {exc}",
            group=spec.group_key,
            rank=spec.placement.rank,
            node=spec.placement.node_rank,
            node_ip=spec.node.ip,
            method="__init__",
        )

    def submit(self, handle, method, args, kwargs):
        forward = getattr(handle.actor, method, None)
        if forward is None:  # not a declared method: the generic entry
            return RayCall(handle.actor._rlinf_execute.remote(method, args, kwargs))
        return RayCall(forward.remote(*args, **kwargs))

    def collect(self, calls: Sequence[RayCall], timeout: Optional[float]):
        ray = self._ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        refs = [c.ref for c in calls]
        needs: list = []  # the workers' log marks that a call's results wait for (``logs``)
        # fast path: everything finishes within the first slice and succeeds
        try:
            values = logs.strip_all(ray.get(refs, timeout=_SLICE if timeout is None else min(_SLICE, timeout)), needs)
            if not any(type(v) is Failed for v in values):
                logs.wait(needs)
                return [from_wire(v) for v in values]
        except (GetTimeoutError, RayActorError, RayTaskError):
            pass
        needs.clear()
        outcomes = self._collect_slow(refs, None if timeout is None else time.monotonic() + timeout, needs)
        logs.wait(needs)
        return outcomes

    def _collect_slow(self, refs, deadline, needs: list):
        """Wait in slices; once a rank fails, give the others a short grace period, then report."""
        ray = self._ray
        outcomes: dict[int, Any] = {}
        index = {r: i for i, r in enumerate(refs)}
        pending = refs
        grace_end = None
        while pending:
            limits = [t for t in (deadline, grace_end) if t is not None]
            wait_for = _SLICE if not limits else max(0.0, min(min(limits) - time.monotonic(), _SLICE))
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=wait_for)
            for ref, outcome in zip(ready, self._fetch(ready, needs)):
                outcomes[index[ref]] = outcome
                if grace_end is None and not (type(outcome) is CallOutcome and outcome.ok):  # failed or died
                    grace_end = time.monotonic() + config.error_grace()
            watch.tick(outcomes)  # stuck calls and dead workers are reported as the wait goes on
            now = time.monotonic()
            if pending and grace_end is not None and now >= grace_end:
                break
            if pending and deadline is not None and now >= deadline:
                raise TimeoutError("calls did not finish in time")
        return [outcomes.get(i, _STILL_RUNNING) for i in range(len(refs))]

    def _fetch(self, refs, needs: list) -> list:
        """Values of ready refs; a dead actor or a failed task becomes its reason (log marks go to ``needs``)."""
        ray = self._ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            return [from_wire(logs.strip(v, needs)) for v in ray.get(refs)]
        except (RayActorError, RayTaskError):
            pass
        out = []
        for ref in refs:
            try:
                out.append(from_wire(logs.strip(ray.get(ref), needs)))
            except RayActorError as exc:
                out.append(Died(exits.death_reason(exc)))
            except RayTaskError as exc:
                out.append(_rejected(exc))
        return out

    async def collect_async(self, calls):
        """``collect`` on the event loop: once a rank fails, the others get the same grace period."""
        import asyncio

        needs: list = []
        tasks = [asyncio.ensure_future(_outcome_of(c.ref, needs)) for c in calls]
        index = {t: i for i, t in enumerate(tasks)}
        pending = set(tasks)
        finished: dict = {}
        grace_end = None
        try:
            while pending:
                # no deadline before a failure: like ``wait()`` without a timeout, the calls themselves
                # are bounded (by RLINF_TIMEOUT for communication); slices let ``watch`` report stuck calls
                wait_for = _SLICE if grace_end is None else max(0.0, min(_SLICE, grace_end - time.monotonic()))
                done, pending = await asyncio.wait(pending, timeout=wait_for, return_when=asyncio.FIRST_COMPLETED)
                if grace_end is None and any(not (type(t.result()) is CallOutcome and t.result().ok) for t in done):
                    grace_end = time.monotonic() + config.error_grace()
                finished.update((index[t], t.result()) for t in done)
                watch.tick(finished)
                if pending and grace_end is not None and time.monotonic() >= grace_end:
                    break
        finally:
            for t in pending:
                t.cancel()
        await logs.wait_async(needs)
        return [t.result() if t.done() and not t.cancelled() else _STILL_RUNNING for t in tasks]

    def stop_workers(self, handles):
        # the placement group goes in ``release_group``, which core calls right after
        for h in handles:
            try:
                self._ray.kill(h.actor, no_restart=True)
            except Exception:
                pass

    def connected(self) -> bool:
        """False once Ray was shut down under this session (``ray.shutdown()``, maybe followed by a new
        ``ray.init``): its registry and actor handles belong to a cluster this process left."""
        return self._ray.is_initialized() and _ray_session_id(self._ray) == self._ray_session

    def discard(self) -> None:
        """Forget the groups and handles of the Ray this process left; stop its watchdog (no Ray call)."""
        self._groups.clear()
        self._nodes_cache = None
        if self._owns_cluster:
            from .status import unpublish_embedded

            unpublish_embedded()
        if self.watchdog is not None:
            self.watchdog.terminate()
            self.watchdog.wait(10)
            self.watchdog = None

    def shutdown(self):
        """Stop every group launched here (actors and placement groups), then disconnect."""
        for name in list(self._groups):
            self.release_group(name)
        if self._owns_cluster and self._ray.is_initialized():
            from .status import unpublish_embedded

            unpublish_embedded()
            self._ray.shutdown()
        if self.watchdog is not None:  # nothing left for it to guard
            self.watchdog.terminate()
            self.watchdog.wait(10)
            self.watchdog = None


async def _outcome_of(ref, needs: list):
    """The outcome of one call, awaited: a value, or why the worker could not answer (its log mark to ``needs``)."""
    from ray.exceptions import RayActorError, RayError, RayTaskError

    try:
        return from_wire(logs.strip(await ref, needs))
    except RayActorError as exc:
        return Died(exits.death_reason(exc))
    except RayTaskError as exc:
        return _rejected(exc)
    except RayError as exc:  # the result is lost with its worker (owner died, object lost, ...)
        return Died(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")


#: outcome of a rank still running when another rank's failure is reported
_STILL_RUNNING = CallOutcome(True, None, {})


def _rejected(exc) -> Rejected:
    """What Ray's error for a call says: the worker could not unpack its arguments, or (``returns``) it ran
    and its return value cannot be pickled, which is said as such (``RETURN_UNPICKLABLE``), without Ray's
    traceback through its serializer."""
    from rlinf.scheduler.base.unpicklable import RETURN_UNPICKLABLE, UnpicklableError

    cause = getattr(exc, "cause", None)
    if isinstance(cause, UnpicklableError):
        return Rejected(f"{RETURN_UNPICKLABLE}{cause}", "")
    return Rejected(f"{type(cause).__name__}: {cause}" if cause is not None else logs.plain(str(exc)).splitlines()[0],
                    logs.plain_traceback(getattr(exc, "traceback_str", "") or str(exc)))


def _start_watchdog():
    """Make sure the embedded cluster dies with this driver, even on SIGKILL (see ``watchdog``).

    The watchdog reads /proc and sends signals; it gets this process's environment (to find Python and
    rlinf) without the cluster's secrets (Ray's token, ``RLINF_CLUSTER_SECRET``), which it never needs."""
    import subprocess
    import sys

    import ray

    from rlinf.scheduler.base import security

    session_dir = ray._private.worker._global_node.get_session_dir_path()
    secret = ("RAY_AUTH_TOKEN", security.SECRET_ENV)
    return subprocess.Popen(
        [sys.executable, "-m", "rlinf.ray.watchdog", str(os.getpid()), session_dir],
        env={k: v for k, v in os.environ.items() if k not in secret},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )


class RayLauncher(Launcher):
    name = "ray"
    # Ray's client retries a cluster that refuses its token without saying so
    status_hint = "a Ray cluster with token authentication needs RAY_AUTH_MODE=token and RAY_AUTH_TOKEN"

    def connect(self, num_nodes: int, **options) -> RaySession:
        """Join the cluster named by ``address=`` or ``RAY_ADDRESS`` ("auto": the ``ray start``
        cluster of this machine), or start an embedded one on loopback."""
        address = options.pop("address", None) or os.environ.get("RAY_ADDRESS")
        _prepare_environment(address)
        import ray

        if ray.is_initialized():
            return RaySession(owns_cluster=False)
        if address:
            ray.init(address=address, log_to_driver=options.pop("log_to_driver", True), **options)
            return RaySession(owns_cluster=False)
        # a private directory of this user (see ``embedded``): never one another user made or can enter
        temp_dir = embedded.ray_temp_dir(options.pop("temp_dir", None) or os.environ.get("RLINF_RAY_TEMP_DIR"))
        ray.init(
            address="local",
            _node_ip_address="127.0.0.1",  # every server Ray lets us place binds to loopback
            include_dashboard=False,
            _temp_dir=temp_dir,
            log_to_driver=options.pop("log_to_driver", True),
            **options,
        )
        try:  # an older Ray may still listen on every address: stop rather than run open to the network
            embedded.check_loopback(ray._private.worker._global_node.get_session_dir_path())
        except BaseException:
            ray.shutdown()
            raise
        session = RaySession(owns_cluster=True)
        session.watchdog = _start_watchdog()
        from .status import publish_embedded

        publish_embedded(ray.get_runtime_context().gcs_address, os.environ.get("RAY_AUTH_TOKEN"))
        return session

    def attach(self) -> RaySession:
        import ray

        if not ray.is_initialized():
            ray.init(address="auto")
        return RaySession(owns_cluster=False)

    def running_groups(self, timeout: float, pid: Optional[int] = None) -> Optional[dict]:
        """The groups of every driver on the cluster at ``RAY_ADDRESS``, read from their registries; or of the
        embedded cluster of program ``pid`` (else of the newest one here)."""
        from .status import running_groups

        return running_groups(timeout, pid)
