"""The MPI job as rlinf sees it: one intracommunicator over the driver and its worker ranks.

Under ``mpiexec`` that is ``COMM_WORLD``; in spawn mode it is the driver merged
with the ranks it spawned.  Rank 0 is always the driver.  Two duplicates keep
traffic apart: ``ctrl`` carries launcher requests and replies, ``data`` carries
transport messages, so neither can ever match the other's messages.

mpi4py is imported only when a world is set up, never at plugin discovery.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from dataclasses import dataclass, field
from typing import Optional

#: how many worker ranks a spawning driver starts (default: max(4, CPUs))
SLOTS_ENV = "RLINF_MPI_SLOTS"


@dataclass(frozen=True)
class RankInfo:
    """What every rank tells the others at start-up."""

    rank: int
    hostname: str
    pid: int
    num_gpus: int
    ip: str = ""


@dataclass
class World:
    comm: object  # the mpi4py intracommunicator: rank 0 is the driver
    ctrl: object
    data: object
    mode: str  # "mpiexec" or "spawn"
    ranks: list[RankInfo] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def node_ranks(self) -> dict[str, int]:
        """Hostname -> node rank: the driver's host is node 0, others by their lowest MPI rank."""
        order: dict[str, int] = {}
        for info in self.ranks:
            order.setdefault(info.hostname, len(order))
        return order


_world: Optional[World] = None
_lock = threading.Lock()


def active() -> bool:
    """Whether this process belongs to an rlinf MPI job (cheap: never imports mpi4py)."""
    return _world is not None


def world() -> World:
    if _world is None:
        raise RuntimeError("this process is not part of an rlinf MPI job (run it with mpiexec -n N python -m rlinf.mpi ...)")
    return _world


def _count_gpus() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len([n for n in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", n)])
    except OSError:
        return 0


def _route_ip(towards: str) -> str:
    """This host's address on the route to ``towards`` (no packet is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(towards), 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _mpi():
    import mpi4py

    mpi4py.rc.thread_level = "multiple"  # launcher, transport and user threads all call MPI
    mpi4py.rc.finalize = False  # exit never waits on a peer that is gone; the job ends when its ranks do
    from mpi4py import MPI

    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise RuntimeError(
            f"the MPI library ({MPI.Get_library_version().splitlines()[0]}) does not provide MPI_THREAD_MULTIPLE, "
            f"which rlinf needs (it calls MPI from several threads)"
        )
    return MPI


def _build(comm, mode: str) -> World:
    hostname = socket.gethostname()
    ranks = comm.allgather((hostname, os.getpid(), _count_gpus()))
    hosts = {h for h, _, _ in ranks}
    if os.environ.get("RLINF_NODE_IP"):
        ip = os.environ["RLINF_NODE_IP"]
    elif len(hosts) == 1:
        ip = "127.0.0.1"
    else:
        ip = _route_ip(ranks[0][0])
    ips = comm.allgather(ip)
    infos = [RankInfo(r, h, pid, gpus, ips[r]) for r, (h, pid, gpus) in enumerate(ranks)]
    return World(comm=comm, ctrl=comm.Dup(), data=comm.Dup(), mode=mode, ranks=infos)


def init_mpiexec() -> World:
    """Every rank of ``mpiexec -n N python -m rlinf.mpi``: the world is COMM_WORLD."""
    global _world
    with _lock:
        if _world is None:
            MPI = _mpi()
            _world = _build(MPI.COMM_WORLD, "mpiexec")
        return _world


def spawn_slots() -> int:
    raw = os.environ.get(SLOTS_ENV)
    if raw:
        try:
            value = int(raw)
        except ValueError:
            raise ValueError(f"{SLOTS_ENV}={raw!r} is not a number of worker ranks") from None
        if value < 1:
            raise ValueError(f"{SLOTS_ENV}={raw!r} must be at least 1")
        return value
    return max(4, os.cpu_count() or 1)


def init_spawning_driver(slots: int) -> World:
    """A plain ``python program.py``: spawn ``slots`` worker ranks and merge them with this process."""
    import shutil
    import sys

    global _world
    with _lock:
        if _world is not None:
            return _world
        if shutil.which("mpiexec") is None:
            raise RuntimeError(
                "RLINF_LAUNCHER=mpi from a plain python process spawns worker ranks with MPI dynamic processes, "
                "which needs the MPI library's mpiexec on PATH (pip install mpich puts one in the environment's bin). "
                "Or start the program with: mpiexec -n N python -m rlinf.mpi program.py"
            )
        MPI = _mpi()
        if MPI.COMM_WORLD.Get_size() > 1:
            raise RuntimeError(
                "this process is one of several MPI ranks but was not started through rlinf.mpi; "
                "run: mpiexec -n N python -m rlinf.mpi program.py"
            )
        try:
            inter = MPI.COMM_SELF.Spawn(
                sys.executable, args=["-m", "rlinf.mpi", "--serve", str(os.getpid())], maxprocs=slots
            )
        except MPI.Exception as exc:
            raise RuntimeError(
                f"the MPI library could not spawn {slots} worker rank(s): {exc.Get_error_string()}. "
                f"Start the program with: mpiexec -n N python -m rlinf.mpi program.py"
            ) from None
        _world = _build(inter.Merge(high=False), "spawn")
        import atexit

        atexit.register(finalize)  # after the launcher's own exit handler has released the ranks
        return _world


def init_spawned() -> World:
    """A worker rank started by a spawning driver."""
    global _world
    with _lock:
        MPI = _mpi()
        parent = MPI.Comm.Get_parent()
        if parent == MPI.COMM_NULL:
            raise RuntimeError("--serve is for worker ranks spawned by an rlinf driver")
        _world = _build(parent.Merge(high=True), "spawn")
        return _world


_before_finalize: list = []


def before_finalize(callback) -> None:
    """Run ``callback()`` at ``finalize``, before MPI ends; the last registered runs first."""
    _before_finalize.append(callback)


def finalize() -> None:
    """A clean end of this rank: stop what uses MPI (links, then the service thread), then ``MPI_Finalize``.

    Under ``mpiexec`` a rank that exits without finalizing makes the MPI
    runtime kill the whole job, so every rank of a job that ended normally
    finalizes (which waits for the other ranks to finalize too).
    """
    if _world is None:
        return
    for callback in reversed(_before_finalize):
        callback()
    from mpi4py import MPI

    from .polling import end_waits

    end_waits(2.0, f"MPI rank {_world.rank} on {socket.gethostname()}")  # threads waiting on MPI requests leave at their next test (a millisecond at most)
    if not MPI.Is_finalized():
        MPI.Finalize()
