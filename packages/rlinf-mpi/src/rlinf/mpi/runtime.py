"""The MPI job as rlinf sees it: one intracommunicator over the driver and its worker ranks.

Under ``mpiexec`` that is ``COMM_WORLD``; in spawn mode it is the driver merged
with the ranks it spawned.  Rank 0 is always the driver.  Two duplicates keep
traffic apart: ``ctrl`` carries launcher requests and replies, ``data`` carries
transport messages, so neither can ever match the other's messages.

mpi4py is imported only when a world is set up, never at plugin discovery.

What MPICH keeps in ``/dev/shm`` (``mpich_shm_*``, a few MB per node) is removed
by ``MPI_Finalize``; a job killed with SIGKILL would leave it there.  So the
lowest rank on each host starts a cleaner (``python -m rlinf.mpi --clean-shm``,
in a session of its own, so that a signal to the job's process group spares it),
which watches that host's ranks and, once every one has ended, removes the
segments they were seen mapping (``clean_shm``): this user's files only, each
the very file seen (device and inode), and only while no process maps it.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import threading
import time
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
    _start_cleaner(infos, comm.Get_rank(), hostname)
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


# -- what the MPI library leaves in /dev/shm --------------------------------------------------
SHM_DIR = "/dev/shm"
#: the names MPICH gives its node-local segments there
SHM_PREFIXES = ("mpich_shm_",)
#: seconds between the cleaner's looks at whether the ranks still run
_LOOK = 0.2
#: seconds between its reads of what they map (segments made since it started)
_MAPS_EVERY = 2.0


def _started(pid) -> Optional[int]:
    """When process ``pid`` started (``/proc/<pid>/stat`` field 22); None once it has ended (or is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _mapped_segments(pid) -> dict[str, tuple[int, int]]:
    """The MPI library's files in ``SHM_DIR`` that process ``pid`` maps: name -> (device, inode)."""
    found: dict[str, tuple[int, int]] = {}
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or not parts[5].startswith(SHM_DIR + "/"):
                    continue
                name = parts[5].rstrip("\n")[len(SHM_DIR) + 1:]
                if "/" in name or not name.startswith(SHM_PREFIXES) or name.endswith(" (deleted)"):
                    continue
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                found[name] = (os.makedev(major, minor), int(parts[4]))
    except (OSError, ValueError):
        pass
    return found


def _start_cleaner(infos: list, rank: int, hostname: str) -> None:
    """The lowest rank on this host starts the cleaner of this host's ranks (never raises)."""
    local = [info for info in infos if info.hostname == hostname]
    if not sys.platform.startswith("linux") or not local or local[0].rank != rank or not os.path.isdir(SHM_DIR):
        return
    spec = {"uid": os.geteuid(), "segments": _mapped_segments("self"),
            "ranks": [(info.pid, _started(info.pid)) for info in local]}
    env = {k: v for k, v in os.environ.items() if k != "RLINF_CLUSTER_SECRET"}  # it needs none of the job's
    try:
        subprocess.Popen([sys.executable, "-m", "rlinf.mpi", "--clean-shm", json.dumps(spec)], env=env,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True, cwd="/")
    except OSError:
        pass  # no cleaner: a killed job's segments stay, as without rlinf


def _in_use(uid: int) -> set:
    """(device, inode) of every segment a process of ``uid`` (any process, for root) maps now."""
    used = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if uid and entry.stat().st_uid != uid:
                    continue
            except OSError:
                continue
            used.update(_mapped_segments(entry.name).values())
    return used


def clean_shm(spec: dict) -> None:
    """The cleaner (``python -m rlinf.mpi --clean-shm SPEC``): wait until every rank in ``spec`` has ended,
    then remove the segments they were seen mapping that are still this user's, the same files, unmapped.

    A rank counts as running while its pid has the start time recorded, so a pid reused since is not
    waited for.  The ranks' maps are read again every ``_MAPS_EVERY`` seconds while they run, for
    segments made after the start."""
    uid = int(spec["uid"])
    segments = {name: tuple(ident) for name, ident in spec["segments"].items()}
    ranks = [(pid, started) for pid, started in spec["ranks"] if started is not None]
    next_read = 0.0
    while True:  # bounded by the ranks' lives: the cleaner ends with the job
        ranks = [(pid, started) for pid, started in ranks if _started(pid) == started]
        if not ranks:
            break
        if time.monotonic() >= next_read:
            for pid, _ in ranks:
                segments.update(_mapped_segments(pid))
            next_read = time.monotonic() + _MAPS_EVERY
        time.sleep(_LOOK)
    if not segments:
        return
    used = _in_use(uid)
    for name, ident in segments.items():
        path = os.path.join(SHM_DIR, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue  # removed by MPI_Finalize: the job ended normally
        if stat.S_ISREG(st.st_mode) and st.st_uid == uid and (st.st_dev, st.st_ino) == ident and ident not in used:
            try:
                os.unlink(path)
            except OSError:
                pass
