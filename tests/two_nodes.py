"""One simulated two-node Ray cluster (4 GPUs advertised per node) for the suite's two-node checks.

``tests/test_accelerators.py`` (GPU placement) and ``tests/test_multinode.py``
(placement, p2p and channels across nodes) share one run of
``gpu_placement_program.py --with-multinode``: starting such a cluster costs
most of what either test takes.  Each test asserts its own part's verdict.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=1)
def run() -> subprocess.CompletedProcess:
    temp_dir = tempfile.mkdtemp(prefix="rl2n")  # short: Ray's socket paths must fit in 107 bytes
    try:
        env = dict(os.environ, RAY_TMPDIR=temp_dir)
        cmd = [sys.executable, os.path.join(HERE, "gpu_placement_program.py"), "--with-multinode"]
        try:
            return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=330)
        except subprocess.TimeoutExpired as exc:  # kept, so the other test reports it instead of running it again
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            return subprocess.CompletedProcess(cmd, -9, out, err + "\n[the two-node program timed out after 330 s]")
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)


def verdict(part: str) -> str:
    """``""`` when ``part`` passed, else what to show: its failure and the output's tail."""
    out = run()
    if f"{part} OK" in out.stdout.splitlines():
        return ""
    return out.stdout[-4000:] + out.stderr[-5000:]
