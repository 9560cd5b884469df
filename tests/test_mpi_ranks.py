"""The README's rank arithmetic for MPI jobs, checked on its own worked example.

The program, the ``-n`` it needs and the refusal it prints with one rank
fewer are all read from the README's MPI section, so the README cannot drift
from what a job does: with exactly that ``-n`` the program runs; with one
rank fewer the user sees one line (no traceback) naming the group that asked,
what holds the ranks and the ``-n`` to use, and the job exits non-zero.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from test_mpi import MPIEXEC, ROOT, _env, leftovers, pytestmark  # noqa: F401  (pytestmark: skip without MPI)

MARKER = "rlinf-mpi-ranks-example"  # in the program's path, to find any rank that outlives its job


def _mpi_section() -> str:
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    start = text.index("\n## Running under MPI")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def readme_example() -> tuple[str, int, str]:
    """``(program, n, refusal)``: the MPI section's python block, its ``mpiexec -n``, and the line shown for ``n - 1``."""
    section = _mpi_section()
    program = section.split("```python\n", 1)[1].split("```", 1)[0]
    after = section.split("```python\n", 1)[1].split("```", 1)[1]
    n = int(re.search(r"`mpiexec -n (\d+) python -m rlinf\.mpi program\.py`", after).group(1))
    refusal = after.split("```text\n", 1)[1].split("```", 1)[0].strip()
    return program, n, refusal


def run_example(tmp_path, n: int) -> subprocess.CompletedProcess:
    folder = tmp_path / MARKER
    folder.mkdir(exist_ok=True)
    (folder / "program.py").write_text(readme_example()[0])
    return subprocess.run([MPIEXEC, "-n", str(n), sys.executable, "-m", "rlinf.mpi", "program.py"], cwd=folder,
                          env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=100)


def test_the_readme_example_counts_the_channel_host():
    program, n, refusal = readme_example()
    # the arithmetic the README spells out: rank 0 + a group of 2 + one channel host
    assert "NodePlacementStrategy([0, 0])" in program and program.count("Channel.create(") == 1
    assert n == 1 + 2 + 1
    assert f"-n {n - 1}" in refusal and f"mpiexec -n {n}" in refusal


@pytest.mark.timeout(120)
def test_readme_example_runs_with_the_readmes_n(tmp_path):
    _, n, _ = readme_example()
    proc = run_example(tmp_path, n)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[0, 1]"
    assert not leftovers(MARKER)


@pytest.mark.timeout(120)
def test_one_rank_fewer_is_one_clear_line(tmp_path):
    _, n, refusal = readme_example()
    proc = run_example(tmp_path, n - 1)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) < 5, proc.stderr  # no traceback through rlinf's modules
    assert "Traceback" not in proc.stderr and "rlinf/" not in proc.stderr, proc.stderr
    # exactly what the README shows: the program's line, the group that asked, the channel holding a rank, the -n
    assert refusal in lines, f"the README shows:\n{refusal}\nthe job printed:\n{proc.stderr}"
    for part in ("program.py:", "PlacementError", "group 'producers'", "the job has 3 ranks", "channel 'queue'",
                 f"mpiexec -n {n}"):
        assert part in refusal
    assert not leftovers(MARKER)


def test_a_zombie_driver_counts_as_gone():
    """A driver that exited but is not reaped yet (its parent waits on output the ranks hold open) is gone:
    ``kill(pid, 0)`` still finds a zombie, and ranks trusting it kept the parent and themselves waiting."""
    from rlinf.scheduler.base.processes import process_running as _process_running

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while _process_running(child.pid):  # until it has exited, unreaped: a zombie
            assert time.monotonic() < deadline, "the child did not exit within 30 s"
            time.sleep(0.01)
        os.kill(child.pid, 0)  # still there for kill(): the case the check must not trust
        assert open(f"/proc/{child.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        child.wait(timeout=30)
    assert _process_running(os.getpid())
