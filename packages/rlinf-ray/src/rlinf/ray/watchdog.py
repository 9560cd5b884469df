"""Stops an embedded Ray cluster whose driver died without cleaning up.

A driver that exits normally (or on KeyboardInterrupt) shuts its local Ray
down itself.  One killed with SIGKILL cannot, and Ray's processes and the
worker processes would live on.  The driver therefore starts this small
process next to its embedded cluster:

    python -m rlinf.ray.watchdog DRIVER_PID SESSION_DIR

It polls the driver every half second and, while the driver lives, keeps a
list of the session's processes: those whose command line names the session
directory, and all their descendants.  Once the driver is gone it kills that
list and whatever the same search finds then, and exits.  The list matters:
Ray's daemons die with the driver (parent-death signal), and their children,
such as ``ray::DashboardAgent`` (whose command line no longer names the
session), are reparented before the watchdog can see whose they were.
Processes are remembered with their start time, so a recycled pid is never
killed.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Optional


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


def _start_time(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def remember(session_dir: str, known: dict[int, int]) -> None:
    """Add the session's current processes to ``known`` (pid -> start time)."""
    for pid in session_processes(session_dir):
        started = _start_time(pid)
        if started is not None:
            known.setdefault(pid, started)


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


def kill_session(session_dir: str, known: Optional[dict[int, int]] = None) -> int:
    """Kill the session's processes: those found now, and those in ``known`` that are still the same process."""
    pids = set(session_processes(session_dir))
    pids.update(pid for pid, started in (known or {}).items() if _start_time(pid) == started)
    pids.discard(os.getpid())
    pids = sorted(pids)
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


#: seconds between looks at the session's process tree while the driver lives
REMEMBER_EVERY = 1.0


def main(argv: list[str]) -> int:
    driver, session_dir = int(argv[0]), argv[1]
    known: dict[int, int] = {}
    next_look = 0.0
    while _alive(driver):
        if time.monotonic() >= next_look:
            remember(session_dir, known)
            next_look = time.monotonic() + REMEMBER_EVERY
        time.sleep(0.5)
    kill_session(session_dir, known)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
