"""Progress lines while a launch waits, and the driver's reports of stuck calls and dead workers."""

import logging
import os
import select
import threading
import time

import pytest

from rlinf.scheduler import Worker, WorkerError
from rlinf.scheduler.base.progress import Progress

from launcher_marks import TEST_LAUNCHER, survives_worker_death

ray_only = pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="holds Ray resources to make a launch wait")


class Napper(Worker):
    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self._rank

    def die(self):
        os._exit(3)


def _hold_cpus_but(left: float) -> list:
    """Placement groups holding all of the cluster's free CPU but ``left`` (Ray's view of free resources lags a little)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    hogs = []
    for _ in range(20):
        free = ray.available_resources().get("CPU", 0)
        if free < 2 * left:
            return hogs
        pg = placement_group([{"CPU": round(free - left, 4)}])
        if ray.wait([pg.ready()], timeout=10)[0]:
            hogs.append(pg)
        else:  # the free CPU was less than Ray said
            remove_placement_group(pg)
        time.sleep(0.5)  # until Ray's view of free resources catches up
    raise AssertionError(f"could not hold the cluster's CPUs: {ray.available_resources()}")


@ray_only
def test_launch_that_waits_for_resources_says_so(cluster, launch, capsys, monkeypatch):
    import ray
    from ray.util.placement_group import remove_placement_group

    monkeypatch.setenv("RLINF_PROGRESS_AFTER", "0.5")
    monkeypatch.setenv("RLINF_PROGRESS_EVERY", "0.5")
    hogs = _hold_cpus_but(0.005)  # less than one worker's 0.01 CPU stays free

    def free_when_waited_on():
        # the resources appear once the launch has waited for them for a while
        deadline = time.monotonic() + 120
        since = None
        while time.monotonic() < deadline:
            mine = {h.id.hex() for h in hogs}
            pending = [pg for pg_id, pg in ray.util.placement_group_table().items()
                       if pg_id not in mine and pg["state"] == "PENDING"]
            since = (since or time.monotonic()) if pending else None
            if since and time.monotonic() - since > 3:
                break
            time.sleep(0.2)
        for h in hogs:
            remove_placement_group(h)

    freed = threading.Thread(target=free_when_waited_on)
    freed.start()
    try:
        g = launch(Napper, name="progress_waits")
    finally:
        freed.join()
    assert g.nap(0).wait() == [0]
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("[rlinf]")]
    waiting = [ln for ln in lines if "group progress_waits: waiting for resources on node(s) [0]: CPU" in ln]
    assert len(waiting) >= 2, err  # repeated, rate-limited, while it waits
    assert lines[-1].startswith("[rlinf] group progress_waits: 1 worker(s) started after"), err


def _drain(master: int) -> str:
    """Everything written to the terminal so far (bounded waits); closes its master side."""
    out = b""
    while select.select([master], [], [], 0.5)[0]:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the terminal's other end is closed and drained
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return out.decode()


def test_progress_is_one_line_on_a_terminal(monkeypatch):
    monkeypatch.setenv("RLINF_PROGRESS_AFTER", "0")
    master, slave = os.openpty()
    with open(slave, "w") as tty, Progress(tty) as line:
        for i in range(3):
            line.update(f"waiting for {i} of 3")
            time.sleep(0.3)  # longer than the redraw interval
    out = _drain(master)
    assert "\n" not in out and out.count("\r") >= 4, repr(out)  # rewritten in place, then cleared
    assert "waiting for 2 of 3" in out and out.endswith("\r")


def test_progress_line_fits_a_narrow_terminal(monkeypatch):
    """A line longer than the terminal is wide would wrap, and ``\\r`` would rewrite only its last
    row: it is cut to the width, keeping the elapsed time."""
    import fcntl
    import struct
    import termios

    monkeypatch.setenv("RLINF_PROGRESS_AFTER", "0")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
    with open(slave, "w") as tty, Progress(tty) as line:
        for i in range(2):
            line.update(f"waiting for resources {{'GPU': 8.0, 'CPU': 4.0}} of node {i}: 3 of 64 worker(s) started")
            time.sleep(0.3)
    shown = [part for part in _drain(master).split("\r") if part.strip()]
    assert len(shown) == 2, shown
    for part in shown:
        assert len(part) <= 39 and part.startswith("[rlinf] waiting") and part.rstrip().endswith("s)"), part
        assert "..." in part


def test_progress_stays_quiet_for_short_waits(monkeypatch, capsys):
    monkeypatch.setenv("RLINF_PROGRESS_AFTER", "30")
    with Progress() as line:
        line.update("waiting")
    assert capsys.readouterr().err == ""


def test_stuck_call_is_reported_once(launch, monkeypatch, caplog):
    monkeypatch.setenv("RLINF_STUCK_CALL_WARN", "1")
    g = launch(Napper, name="progress_stuck")
    pid = g.worker_info_list[0].pid
    with caplog.at_level(logging.WARNING, logger="rlinf.watch"):
        assert g.nap(3.5).wait() == [0]
    lines = [r.getMessage() for r in caplog.records if r.name == "rlinf.watch"]
    assert len(lines) == 1, lines
    assert "'nap'" in lines[0] and "progress_stuck/0" in lines[0] and f"pid {pid}" in lines[0], lines


@survives_worker_death
def test_dead_worker_is_reported(launch, monkeypatch, caplog):
    monkeypatch.setenv("RLINF_ERROR_GRACE", "0.5")
    g = launch(Napper, name="progress_dead")
    pid = g.worker_info_list[0].pid
    with caplog.at_level(logging.WARNING, logger="rlinf.watch"), pytest.raises(WorkerError):
        g.die().wait(timeout=60)
    lines = [r.getMessage() for r in caplog.records if r.name == "rlinf.watch"]
    assert any("progress_dead/0" in ln and f"pid {pid}" in ln and "'die'" in ln for ln in lines), lines
