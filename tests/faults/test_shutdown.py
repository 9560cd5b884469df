"""The driver's exit, a KeyboardInterrupt, an explicit close, or a SIGKILL of the
driver stop every worker and every process of its embedded cluster.

Leftovers are found with psutil, not with the code under test: every process
of the driver's tree (Ray's GCS, raylet, workers, the watchdog, ...) is
recorded while the driver runs, with its start time so a reused pid is not
mistaken for it, and each must be gone afterwards; so must any process whose
command line names the Ray session's directory.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

PROGRAM = os.path.join(os.path.dirname(__file__), "driver_program.py")


def _tree(pid) -> dict:
    """``{pid: (create_time, name)}`` of ``pid`` and all its descendants."""
    out = {}
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            try:
                out[p.pid] = (p.create_time(), p.name())
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return out


def _still_running(recorded: dict) -> list:
    alive = []
    for pid, (created, name) in recorded.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} ({name})")
        except psutil.Error:
            pass
    return alive


def _naming(session: str) -> list:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid != os.getpid() and any(session in part for part in p.info["cmdline"] or ()) \
                    and p.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{p.pid} {' '.join(p.info['cmdline'])[:120]}")
        except psutil.Error:
            pass
    return found


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
        workers = {int(a), int(b)}
        recorded = _tree(proc.pid)
        assert workers <= set(recorded), f"workers {workers} are not in the driver's process tree {recorded}"
        assert len(recorded) >= 4, recorded  # driver, Ray's own processes, two workers
        if mode == "kill":
            time.sleep(1.0)
            proc.kill()
        elif mode == "close":
            assert proc.stdout.readline().startswith("CLOSED")
            recorded.pop(proc.pid)  # the driver itself keeps running after close
        else:
            proc.wait(60)
        ended = time.monotonic()
        deadline = ended + 30
        while time.monotonic() < deadline and (_still_running(recorded) or _naming(session)):
            time.sleep(0.25)
        return proc, recorded, session, time.monotonic() - ended
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("mode", ["exit", "interrupt", "close", "kill"])
def test_driver_end_stops_everything(mode):
    proc, recorded, session, took = _run(mode)
    left = _still_running(recorded)
    if left:  # say how long they linger before failing
        start = time.monotonic()
        while time.monotonic() - start < 90 and _still_running(recorded):
            time.sleep(0.5)
        lingered = f"all gone {took + time.monotonic() - start:.0f} s after the driver ended" \
            if not _still_running(recorded) else "still running 2 min after the driver ended"
        pytest.fail(f"left running 30 s after '{mode}': {left}; {lingered}")
    assert not _naming(session), f"processes of the Ray session left after '{mode}': {_naming(session)}"
    if mode == "exit":
        assert proc.returncode == 3  # the program's own exit code is kept
    if mode == "interrupt":
        assert proc.returncode != 0
    assert took < 30
    print(f"{mode}: {len(recorded)} processes, all gone {took:.1f} s after the driver ended")
