"""The seeded chaos run (``chaos_program.py``): its invariants hold.

The program runs as a subprocess with its own Ray cluster (loopback, its
own temp dir, its own process group, killed at the end), so the workers it
SIGKILLs are never shared with other tests.  Set ``RLINF_CHAOS_SEED`` to
replay a failing run; every violation it prints carries its seed.

The suite runs it for ``RLINF_CHAOS_SECONDS`` (default 10), and past that
until it made ``MIN_STEPS`` steps and killed ``MIN_KILLS`` workers (what the
test asks of a run: about what 10 s make on a quiet machine, each operation
kind several times, a relaunch after each kill; most of a step's time is the
relaunch after a kill and the fresh workers' first import of torch);
``hatch run chaos --minutes 10`` is the long run.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from launcher_marks import TEST_LAUNCHER

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chaos_program.py")
SECONDS = int(os.environ.get("RLINF_CHAOS_SECONDS", "10"))
MIN_STEPS, MIN_KILLS = 20, 2


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="kills worker processes, which ends an MPI job")
@pytest.mark.timeout(SECONDS + 330)
def test_chaos_run_keeps_its_invariants():
    seed = int(os.environ.get("RLINF_CHAOS_SEED", "1"))
    with tempfile.TemporaryDirectory(prefix="rlc") as tmp:
        proc = subprocess.Popen(
            [sys.executable, PROGRAM, "--seconds", str(SECONDS), "--min-steps", str(MIN_STEPS),
             "--min-kills", str(MIN_KILLS), "--seed", str(seed), "--temp-dir", tmp],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )
        try:
            out, _ = proc.communicate(timeout=SECONDS + 290)
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # the program's group: whatever it left behind
            except ProcessLookupError:
                pass
            proc.wait(10)
    lines = [line for line in out.splitlines() if line.startswith("CHAOS_SUMMARY ")]
    assert lines, f"seed {seed}: no summary; exit {proc.returncode}; output tail:\n{out[-4000:]}"
    summary = json.loads(lines[-1][len("CHAOS_SUMMARY "):])
    print(json.dumps({k: v for k, v in summary.items() if k != "resources"}, indent=1))
    assert summary["seed"] == seed
    assert sum(summary["operations"].values()) >= MIN_STEPS and summary["kills"] >= MIN_KILLS, summary
    assert all(summary["operations"].get(f"op_{kind}", 0) >= 3 for kind in ("call", "p2p", "channel")), summary
    assert summary["violations"] == [], "\n".join(summary["violations"])
    assert proc.returncode == 0, out[-4000:]
