"""The launcher interface: what a backend must do to run worker groups.

A launcher starts one process per worker, wherever the placement says,
hosts a ``rlinf.scheduler.runtime.host.WorkerHost`` in it, forwards method calls to
that host, notices when a process dies, and keeps a cluster-wide registry of
groups so that any worker (or the driver) can find any other by name.
Everything else (placement, environment variables, timing, error reports,
communication) is done by core, identically for every launcher.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional, Sequence

from ..base.address import WorkerAddress
from ..base.info import WorkerInfo
from .placement import NodeInfo, WorkerPlacement


@dataclass
class WorkerSpec:
    """Everything needed to start one worker process."""

    group_key: str
    address: WorkerAddress
    world_size: int
    placement: WorkerPlacement
    node: NodeInfo
    env: dict[str, str] = field(repr=False)  # holds the cluster secret: never in a repr
    class_name: str = ""
    methods: tuple = ()  # public methods of the worker class, for launchers that declare them
    async_methods: tuple = ()  # those that are ``async def``: the worker runs calls concurrently on one event loop
    max_concurrency: Optional[int] = None  # most calls running at once in one worker (None: launcher default)


@dataclass
class WorkerRecord:
    """A started worker as the registry stores it: its info and its endpoints."""

    info: WorkerInfo
    endpoints: dict = field(default_factory=dict)  # transport name -> connection info
    status: Optional[dict] = field(default=None, repr=False)  # the worker's status listener (``status_server``), with its token


@dataclass
class GroupRecord:
    name: str
    class_name: str
    workers: list[WorkerRecord]
    launcher: str = ""


class CallOutcome(NamedTuple):
    """What one rank returned for one call: a value or an error, plus that call's timings."""

    ok: bool
    value: Any
    durations: dict


class Died(NamedTuple):
    """What ``collect`` reports for a rank whose process died: the launcher's reason."""

    reason: str


class Rejected(NamedTuple):
    """What ``collect`` reports for a call the worker could not start (its arguments
    could not be unpacked there, say): the launcher's reason and traceback."""

    reason: str
    traceback: str = ""


class Timed(NamedTuple):
    """On the wire: a successful call that recorded timings."""

    value: Any
    durations: dict


class Failed(NamedTuple):
    """On the wire: a call that raised (``error`` is a ``WorkerMethodError``)."""

    error: Any
    durations: dict


def to_wire(outcome: CallOutcome):
    """The cheapest form of an outcome to carry back.

    The common case, success without timings, travels as the bare return
    value, so a group call costs what a raw call returning the same value costs.
    """
    if not outcome.ok:
        return Failed(outcome.value, outcome.durations)
    if outcome.durations or type(outcome.value) in (Timed, Failed, Died):
        return Timed(outcome.value, outcome.durations)
    return outcome.value


def from_wire(value) -> CallOutcome:
    kind = type(value)
    if kind is Timed:
        return CallOutcome(True, value.value, value.durations)
    if kind is Failed:
        return CallOutcome(False, value.error, value.durations)
    return CallOutcome(True, value, {})


class PendingCall(ABC):
    """One submitted call on one worker."""

    @abstractmethod
    def done(self) -> bool: ...


class LauncherSession(ABC):
    """A live connection to one cluster through one launcher."""

    launcher_name: str = ""
    #: set by ``Cluster``: the first explicit node count and cluster config of this process
    chosen_num_nodes: Optional[int] = None
    cluster_cfg: Optional[dict] = None
    #: whether nodes may still join (a running multi-node cluster): ``Cluster(num_nodes=N)``
    #: then waits for them; otherwise too few nodes is an error at once
    nodes_can_join: bool = False

    @property
    @abstractmethod
    def nodes(self) -> Sequence[NodeInfo]:
        """The cluster's nodes, node 0 first (the node of the driver where possible)."""

    @abstractmethod
    def start_workers(self, specs: Sequence[WorkerSpec], payload: bytes, timeout: float) -> list[tuple[Any, WorkerRecord]]:
        """Start and construct one worker per spec; return (handle, record) per rank.

        ``payload`` is the pickled (class, args, kwargs) to construct in each
        process through ``WorkerHost.construct``.  On any failure, stop what was
        started and raise ``LaunchError`` naming the rank.
        """

    @abstractmethod
    def submit(self, handle: Any, method: str, args: tuple, kwargs: dict) -> PendingCall:
        """Run ``WorkerHost.execute(method, args, kwargs)`` in the worker; do not block."""

    @abstractmethod
    def collect(self, calls: Sequence[PendingCall], timeout: Optional[float]) -> list:
        """Wait for the calls; per call return a ``CallOutcome`` or a ``Died``.

        What a host's ``execute`` returned travels in wire form (``to_wire``);
        turn it back with ``from_wire``.

        Raise ``TimeoutError`` if they are not all done within ``timeout``.
        """

    async def collect_async(self, calls: Sequence[PendingCall]) -> list:
        """Awaitable ``collect``; the default runs it in a thread."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, self.collect, calls, None)

    @abstractmethod
    def stop_workers(self, handles: Sequence[Any]) -> None:
        """Stop the processes (idempotent)."""

    # -- registry -----------------------------------------------------------
    @abstractmethod
    def reserve_group(self, name: str) -> None:
        """Claim a group name cluster-wide; raise ``GroupNameError`` if taken."""

    @abstractmethod
    def register_group(self, record: GroupRecord) -> None:
        """Publish the records of a reserved group."""

    @abstractmethod
    def release_group(self, name: str) -> None:
        """Forget a group (after it stopped or failed to start)."""

    @abstractmethod
    def lookup_group(self, name: str) -> Optional[GroupRecord]:
        """The group's record, or None if no such group is registered."""

    @abstractmethod
    def list_groups(self) -> list[str]: ...

    def attach_group(self, name: str) -> Optional[list]:
        """Handles (as ``start_workers`` returned them), rank order, on the workers of the
        running group ``name``, which this or another process of the cluster launched;
        None if no such group runs.  Launchers that cannot do this raise ``NotImplementedError``."""
        raise NotImplementedError(
            f"the {self.launcher_name or type(self).__name__} launcher cannot attach to a running group"
        )

    def publish_cluster(self, info: dict) -> dict:
        """Make the driver's cluster choice (``num_nodes``, ``cluster_cfg``) visible to its workers,
        so that ``Cluster()`` in a worker is the driver's cluster; the first choice wins."""
        return info

    def published_cluster(self) -> Optional[dict]:
        """What the driver published, if this launcher can tell its workers."""
        return None

    def refresh_nodes(self) -> None:
        """Forget any cached node list, so that ``nodes`` sees nodes that joined since."""

    def shutdown(self) -> None:
        """Disconnect; an embedded cluster started by this session is stopped."""

    def connected(self) -> bool:
        """Whether the connection still stands; False once the program disconnected it behind rlinf's back
        (``ray.shutdown()``): the next ``Cluster()`` then connects afresh.  Default: True."""
        return True

    def discard(self) -> None:
        """Drop what this session holds after its connection went away (``connected()`` is False); no remote call."""


class Launcher(ABC):
    """Factory of sessions; built by a ``LauncherPlugin``'s factory."""

    name: str = ""
    #: said when ``running_groups`` does not come back in time (what to check)
    status_hint: str = ""

    def running_groups(self, timeout: float) -> Optional[dict]:
        """For ``python -m rlinf.scheduler status``, from a process outside the cluster.

        Find the running cluster this launcher can see from here (Ray: ``RAY_ADDRESS``)
        without starting or changing anything, within about ``timeout`` seconds, and
        return ``{"launcher": name, "address": str, "groups": [GroupRecord, ...]}``; None
        when this launcher sees no running cluster.  Raise ``RuntimeError`` with a
        one-line reason when one is named but cannot be reached.
        """
        return None

    @abstractmethod
    def connect(self, num_nodes: int, **options) -> LauncherSession:
        """From a driver: join the running cluster, or start an embedded one."""

    @abstractmethod
    def attach(self) -> LauncherSession:
        """From inside a worker process started by this launcher: the same cluster."""


#: ``() -> LauncherSession`` of this process, registered by the runtime (``cluster``); layers under it
#: (point-to-point, channels) find peer groups through it without importing the runtime
_session_provider = None


def provide_current_session(provider) -> None:
    """Register how ``current_session()`` finds this process's session (done once, by the runtime)."""
    global _session_provider
    _session_provider = provider
    return provider


def current_session() -> LauncherSession:
    """The launcher session of this process: the worker's own launcher, or the one the driver chose."""
    if _session_provider is None:
        raise RuntimeError("no cluster runtime is loaded in this process: import rlinf.scheduler first")
    return _session_provider()
