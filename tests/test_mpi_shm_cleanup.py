"""What MPICH keeps in /dev/shm for an MPI job goes when the job is SIGKILLed, and nothing else does.

MPICH removes its node's ``mpich_shm_*`` segments in ``MPI_Finalize``; a job
killed with SIGKILL never gets there.  ``rlinf.mpi`` watches each host's ranks
from a process of its own and, once every one of them has ended, removes the
segments that those ranks mapped: this user's files, the very ones seen mapped
(device and inode), and only while no process maps them.  Another job's file
of the same kind, and another user's, stay.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
import uuid

from test_mpi import MPIEXEC, ROOT, _env, gone_within, pytestmark  # noqa: F401  (pytestmark: skip without MPI)

SHM = "/dev/shm"
NOBODY = 65534

PROGRAM = textwrap.dedent(
    """
    import time
    from rlinf.mpi import runtime

    print("PIDS", *[r.pid for r in runtime.world().ranks], flush=True)
    time.sleep(120)  # until the test kills the job
    """
)


def _mapped(pid: int) -> set[str]:
    """The ``mpich_shm_*`` files of /dev/shm that process ``pid`` maps."""
    with open(f"/proc/{pid}/maps") as f:
        return {os.path.basename(line.split(None, 5)[5].strip()) for line in f
                if len(line.split(None, 5)) == 6 and "/dev/shm/mpich_shm_" in line}


def _read_line(proc: subprocess.Popen, prefix: str, timeout: float) -> str:
    """The first line of ``proc``'s output that starts with ``prefix``, waited for at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        seen = []
        while time.monotonic() < deadline:
            if not sel.select(deadline - time.monotonic()):
                break
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith(prefix):
                return line
    raise AssertionError(f"no {prefix!r} line within {timeout} s; output: {''.join(seen)!r}")


def test_a_killed_jobs_mpich_segments_are_removed_and_only_those(tmp_path):
    program = tmp_path / "hold.py"
    program.write_text(PROGRAM)
    tag = uuid.uuid4().hex[:8]
    other_job = os.path.join(SHM, f"mpich_shm_{tag}_0")  # this user's, of no job the test started
    other_user = os.path.join(SHM, f"mpich_shm_{tag}_1")
    with open(other_job, "wb") as f:
        f.write(b"\0" * 4096)
    subprocess.run(["sh", "-c", f"head -c 4096 /dev/zero > {other_user}"], user=NOBODY, group=NOBODY, check=True,
                   timeout=30)
    proc = subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "rlinf.mpi", str(program)], cwd=ROOT,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        ranks = [int(p) for p in _read_line(proc, "PIDS", 60).split()[1:]]
        segments = set().union(*(_mapped(pid) for pid in ranks))
        assert segments, "the job's ranks map no mpich_shm_* file: nothing to check"
        for pid in [proc.pid, *ranks]:  # the whole job, at once
            os.kill(pid, signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(os.path.exists(os.path.join(SHM, s)) for s in segments):
            time.sleep(0.05)
        left = sorted(s for s in segments if os.path.exists(os.path.join(SHM, s)))
        assert not left, f"the killed job's segments stayed in {SHM}: {left}"
        assert os.path.exists(other_job) and os.path.exists(other_user), "a file of no job of ours was removed"
        assert not gone_within(f'"ranks": [[{ranks[0]}, ', 5), "the job's cleaner outlived it"
    finally:
        proc.kill()
        proc.wait(30)
        for path in (other_job, other_user):
            if os.path.exists(path):
                os.unlink(path)
