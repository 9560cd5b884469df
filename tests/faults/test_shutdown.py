"""The driver's exit, a KeyboardInterrupt, an explicit close, or a SIGKILL of the
driver stop every worker and every process of its embedded cluster."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from p2p_helpers import process_alive
from rlinf.ray.watchdog import session_processes

PROGRAM = os.path.join(os.path.dirname(__file__), "driver_program.py")


def _run(mode):
    temp_dir = tempfile.mkdtemp(prefix="rlsd")
    proc = subprocess.Popen([sys.executable, PROGRAM, temp_dir, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 120
        while not line.startswith("STATE") and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert line.startswith("STATE"), proc.stderr.read()[-3000:]
        _, a, b, session = line.split()
        pids = [int(a), int(b)]
        if mode == "kill":
            time.sleep(1.0)
            proc.kill()
        elif mode == "close":
            assert proc.stdout.readline().startswith("CLOSED")
        else:
            proc.wait(60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (any(process_alive(p) for p in pids) or session_processes(session)):
            time.sleep(0.25)
        return proc, pids, session
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["exit", "interrupt", "close", "kill"])
def test_driver_end_stops_everything(mode):
    start = time.monotonic()
    proc, pids, session = _run(mode)
    assert not [p for p in pids if process_alive(p)], f"workers left running after '{mode}'"
    assert session_processes(session) == [], f"Ray processes left running after '{mode}'"
    if mode == "exit":
        assert proc.returncode == 3  # the program's own exit code is kept
    if mode == "interrupt":
        assert proc.returncode != 0
    assert time.monotonic() - start < 150
