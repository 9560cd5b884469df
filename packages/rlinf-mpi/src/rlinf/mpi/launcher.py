"""MPI sessions: groups of workers on the ranks of an MPI job.

Rank 0 runs the user's program and keeps the job's bookkeeping
(``Coordinator``); every other rank hosts one worker at a time (``slot``).
A session in any process (the driver, or a worker launching a group of its
own) asks rank 0 for ranks, then talks to those ranks directly.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import cloudpickle

from rlinf.scheduler.base import config, progress
from rlinf.scheduler.plugins import watch
from rlinf.scheduler.base.errors import GroupNameError, LaunchError, PlacementError, WorkerError
from rlinf.scheduler.plugins.launcher import CallOutcome, Died, Launcher, LauncherSession, PendingCall, Rejected, from_wire
from rlinf.scheduler.plugins.placement import NodeInfo

from . import runtime
from .coordinator import Coordinator
from .service import RemoteError, rank_alive, service, wait_future
from .slot import CallRejected

#: seconds between looks at a launch's progress (for its line on the terminal)
_PROGRESS_SLICE = 0.5

log = logging.getLogger("rlinf.mpi")

#: seconds ``stop_workers`` waits for a rank to let go of its worker
STOP_WAIT = 30.0
#: seconds between liveness checks of ranks with calls outstanding
_SLICE = 1.0


@dataclass
class MpiHandle:
    mpi_rank: int
    rank: int
    generation: int
    group: str


class MpiCall(PendingCall):
    __slots__ = ("future", "handle")

    def __init__(self, future, handle: MpiHandle):
        self.future = future
        self.handle = handle

    def done(self) -> bool:
        return self.future.done()


_coordinator: Optional[Coordinator] = None
_job_ended = False
_driver_lock = threading.Lock()


def start_driver(world: runtime.World) -> None:
    """Rank 0: keep the job's bookkeeping and serve it to the other ranks."""
    global _coordinator
    with _driver_lock:
        if _coordinator is None:
            _coordinator = Coordinator(world)
            _coordinator.serve(service())
            atexit.register(end_job)


def end_job(wait: float = 5.0) -> None:
    """Rank 0, at the end of the program: tell every worker rank to exit (bounded)."""
    global _job_ended
    if _job_ended or not runtime.active() or runtime.world().rank != 0:
        return
    _job_ended = True
    from rlinf.scheduler.tracing import write_before_exit

    write_before_exit()  # RLINF_TRACE: the workers' events, while they are still there to ask
    world = runtime.world()
    svc = service()
    deadline = time.monotonic() + wait
    futures = []
    for rank in range(1, world.size):
        try:
            futures.append((rank, svc.request(rank, "exit", None, deadline)))
        except (TimeoutError, ConnectionError):
            pass
    for rank, fut in futures:
        try:
            wait_future(fut, deadline, rank, "exit")
        except Exception:
            pass


def _outcome(call: MpiCall):
    try:
        return from_wire(call.future.result())
    except CallRejected as exc:
        return Rejected(exc.reason, exc.traceback_text)
    except ConnectionError as exc:
        return Died(str(exc))
    except RemoteError as exc:
        return Rejected(str(exc))
    except Exception as exc:
        return Rejected(f"{type(exc).__name__}: {exc}")


#: outcome of a rank still running when another rank's failure is reported
_STILL_RUNNING = CallOutcome(True, None, {})


class MpiSession(LauncherSession):
    #: async workers run their calls on a loop of their own; other calls run one at a time per rank
    concurrency = ("async",)

    def __init__(self, world: runtime.World):
        self._world = world
        self._service = service()
        self._handles: list[MpiHandle] = []
        self._nodes: Optional[list[NodeInfo]] = None

    # -- nodes ------------------------------------------------------------------
    @property
    def nodes(self) -> list[NodeInfo]:
        if self._nodes is None:
            order = self._world.node_ranks()
            by_node: dict[int, list[runtime.RankInfo]] = {}
            for info in self._world.ranks:
                by_node.setdefault(order[info.hostname], []).append(info)
            self._nodes = [
                NodeInfo(node_rank=n, ip=infos[0].ip, num_gpus=max(i.num_gpus for i in infos),
                         node_id=infos[0].hostname, hostname=infos[0].hostname)
                for n, infos in sorted(by_node.items())
            ]
        return self._nodes

    # -- bookkeeping on rank 0 ------------------------------------------------------------
    def _coordinator(self, op: str, body=None):
        if self._world.rank == 0:
            return _coordinator.handle(op, body)
        return self._service.call(0, op, body, timeout=60)

    def reserve_group(self, name: str) -> None:
        if not self._coordinator("reserve", name):
            raise GroupNameError(f"group name {name!r} is taken")

    def register_group(self, record) -> None:
        handles = [(h.mpi_rank, h.rank, h.generation) for h in self._handles if h.group == record.name]
        self._coordinator("register", (record, sorted(handles, key=lambda h: h[1])))

    def attach_group(self, name: str) -> Optional[list]:
        """Handles on the workers of the running group ``name`` (launched by any process of the job)."""
        found = self._coordinator("attach", name)
        return None if found is None else [MpiHandle(m, r, g, name) for m, r, g in found]

    def release_group(self, name: str) -> None:
        try:
            self._coordinator("release", name)
        except Exception:
            pass  # rank 0 is gone: the job is ending

    def lookup_group(self, name: str):
        return self._coordinator("lookup", name)

    def list_groups(self) -> list[str]:
        return self._coordinator("names")

    # -- workers ----------------------------------------------------------------------
    def start_workers(self, specs, payload, timeout):
        group = specs[0].group_key
        deadline = time.monotonic() + timeout
        # made before ranks are taken: a bad RLINF_PROGRESS_AFTER or _EVERY must not leave them taken
        line = progress.Progress()
        try:
            ranks = self._coordinator("allocate", (group, [s.node.node_rank for s in specs]))
        except PlacementError as exc:  # raised afresh: the caller's traceback ends here, not in the bookkeeping
            raise PlacementError(str(exc)) from None
        started: list[int] = []
        try:
            port = self._service.call(ranks[0], "reserve_port", None, timeout=timeout)
            futures = [self._service.request(r, "construct", (spec, payload, port), deadline) for r, spec in zip(ranks, specs)]
            started = list(ranks)
            out = []
            for mpi_rank, spec, fut in zip(ranks, specs, futures):
                try:
                    generation, record = self._constructed(fut, deadline, mpi_rank, line,
                                                           f"group {group}: {len(out)} of {len(specs)} worker(s) started")
                except WorkerError:
                    raise
                except TimeoutError:
                    raise LaunchError(f"the worker on MPI rank {mpi_rank} did not start within {timeout:.0f} s",
                                      group=group, rank=spec.placement.rank, node=spec.placement.node_rank,
                                      node_ip=spec.node.ip, method="__init__") from None
                except Exception as exc:
                    raise LaunchError(f"the worker on MPI rank {mpi_rank} failed to start: {type(exc).__name__}: {exc}",
                                      group=group, rank=spec.placement.rank, node=spec.placement.node_rank,
                                      node_ip=spec.node.ip, method="__init__") from None
                handle = MpiHandle(mpi_rank, spec.placement.rank, generation, group)
                out.append((handle, record))
        except BaseException:
            line.close()
            self._release_ranks(started, ranks)
            raise
        line.close(f"group {group}: {len(specs)} worker(s) started")
        self._handles.extend(h for h, _ in out)
        return out

    @staticmethod
    def _constructed(fut, deadline: float, mpi_rank: int, line, waiting: str):
        """The constructor's answer, waited for in slices that keep the progress line (``waiting``) current."""
        while True:
            line.update(waiting)
            try:
                return wait_future(fut, min(deadline, time.monotonic() + _PROGRESS_SLICE), mpi_rank, "construct")
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise

    def _release_ranks(self, started: list[int], ranks: list[int]) -> None:
        """After a failed launch: every rank lets go of whatever it built; unused ranks are freed here."""
        self._stop(started, None)
        try:
            self._coordinator("release_ranks", [r for r in ranks if r not in started])
        except Exception:
            pass

    def _stop(self, mpi_ranks: list[int], generations) -> None:
        deadline = time.monotonic() + STOP_WAIT
        futures = []
        for i, r in enumerate(mpi_ranks):
            generation = None if generations is None else generations[i]
            try:
                futures.append((r, self._service.request(r, "stop", generation, deadline)))
            except (TimeoutError, ConnectionError):
                pass
        for r, fut in futures:
            try:
                wait_future(fut, deadline, r, "stop")
            except Exception as exc:
                log.warning("MPI rank %d did not let go of its worker within %g s: %s", r, STOP_WAIT, exc)

    def submit(self, handle: MpiHandle, method, args, kwargs):
        try:
            packed = cloudpickle.dumps((args, kwargs), protocol=5)
        except Exception as exc:
            raise TypeError(f"cannot send the arguments of {method!r} to group {handle.group!r}: "
                            f"{type(exc).__name__}: {exc}") from exc
        return MpiCall(self._service.request(handle.mpi_rank, "execute", (handle.generation, method, packed)), handle)

    def collect(self, calls: Sequence[MpiCall], timeout: Optional[float]):
        deadline = None if timeout is None else time.monotonic() + timeout
        outcomes: dict[int, Any] = {}
        grace_end = None
        while True:
            for i, call in enumerate(calls):
                if i not in outcomes and call.future.done():
                    outcome = outcomes[i] = _outcome(call)
                    if grace_end is None and not (type(outcome) is CallOutcome and outcome.ok):
                        grace_end = time.monotonic() + config.error_grace()
            pending = [c.future for i, c in enumerate(calls) if i not in outcomes]
            if not pending:
                break
            now = time.monotonic()
            if grace_end is not None and now >= grace_end:
                break
            if deadline is not None and now >= deadline:
                raise TimeoutError("calls did not finish in time")
            watch.tick(outcomes)  # stuck calls and dead workers are reported as the wait goes on
            limits = [t - now for t in (deadline, grace_end) if t is not None]
            concurrent.futures.wait(pending, timeout=min([_SLICE, *limits]), return_when=concurrent.futures.FIRST_COMPLETED)
            for i, call in enumerate(calls):
                if i not in outcomes and not call.future.done() and not rank_alive(call.handle.mpi_rank):
                    self._service.forget(call.future)
                    outcomes[i] = Died(f"MPI rank {call.handle.mpi_rank}'s process exited")
                    if grace_end is None:
                        grace_end = time.monotonic() + config.error_grace()
        return [outcomes.get(i, _STILL_RUNNING) for i in range(len(calls))]

    def stop_workers(self, handles: Sequence[MpiHandle]):
        handles = list(handles)
        self._stop([h.mpi_rank for h in handles], [h.generation for h in handles])
        self._handles = [h for h in self._handles if h not in handles]

    def shutdown(self):
        """Stop the groups this session launched; the ranks live until the program ends."""
        if self._handles:
            self.stop_workers(self._handles)


class MpiLauncher(Launcher):
    name = "mpi"

    def connect(self, num_nodes: int, **options) -> MpiSession:
        if options:
            raise TypeError(f"the mpi launcher takes no options, got {sorted(options)}")
        if runtime.active():
            world = runtime.world()
        else:
            world = runtime.init_spawning_driver(runtime.spawn_slots())
        if world.rank != 0:
            raise RuntimeError("only rank 0 of an rlinf MPI job runs the program")
        start_driver(world)
        return MpiSession(world)

    def attach(self) -> MpiSession:
        return MpiSession(runtime.world())

    def running_groups(self, timeout: float) -> Optional[dict]:
        """The MPI jobs of this user on this machine, from the files their rank 0 keeps (``status``)."""
        from .status import running_groups

        return running_groups(timeout)
