"""Stops an embedded Ray cluster whose driver died without cleaning up.

A driver that exits normally (or on KeyboardInterrupt) shuts its local Ray
down itself.  One killed with SIGKILL cannot, and Ray's processes and the
worker processes would live on.  The driver therefore starts this small
process next to its embedded cluster:

    python -m rlinf.ray.watchdog DRIVER_PID SESSION_DIR

It polls the driver every half second; once the driver is gone it kills
every process whose command line names the session directory, and all
their descendants, then exits.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) for every process we can read."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (ppid, cmd)
    return out


def session_processes(session_dir: str) -> list[int]:
    procs = _processes()
    roots = {pid for pid, (_, cmd) in procs.items() if session_dir in cmd and pid != os.getpid()}
    found = set(roots)
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _) in procs.items():
            if ppid in found and pid not in found and pid != os.getpid():
                found.add(pid)
                changed = True
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_session(session_dir: str) -> int:
    pids = session_processes(session_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
    return len(pids)


def main(argv: list[str]) -> int:
    driver, session_dir = int(argv[0]), argv[1]
    while _alive(driver):
        time.sleep(0.5)
    kill_session(session_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
