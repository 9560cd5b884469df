"""Worker logging as RLinf programs use it: ``log_*`` helpers and ``self.logger``, lines
prefixed with the worker's address and node, INFO and above on the driver's terminal,
``RLINF_LOG_LEVEL``, one file per worker with ``Cluster(distributed_log_dir=...)``, and a
failing call logged as it happens even when nobody waits on it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid

import pytest

from launcher_marks import TEST_LAUNCHER
from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Chatty(Worker):
    def __init__(self):
        super().__init__()

    def talk(self):
        self.log_debug("debug-line")
        self.log_info("info-line")
        self.log_warning("warning-line")
        self.log_error("error-line")
        self.log_on_first_rank("first-rank-line")
        self.log_on_last_rank("last-rank-line")
        self.logger.info("logger-line")
        return self._rank

    def fail(self):
        raise RuntimeError("nobody-waits-for-this")


def _read_until(path, needle, timeout=30.0) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                text = f.read()
            if needle in text:
                return text
        time.sleep(0.1)
    return text


def test_distributed_log_dir_writes_one_prefixed_file_per_worker(cluster, tmp_path, monkeypatch):
    log_dir = tmp_path / "logs"
    monkeypatch.setenv("RLINF_LOG_LEVEL", "DEBUG")
    monkeypatch.delenv("RLINF_DISTRIBUTED_LOG_DIR", raising=False)
    Cluster(distributed_log_dir=str(log_dir))  # the running cluster; the option applies to groups launched next
    try:
        name = f"chatty_{uuid.uuid4().hex[:6]}"
        g = Chatty.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name=name)
    finally:
        os.environ.pop("RLINF_DISTRIBUTED_LOG_DIR", None)  # later tests' workers log to the terminal only
    try:
        assert g.talk().wait(timeout=60) == [0, 1]
        g.fail()  # never waited on
        files = {r: str(log_dir / f"{name}:{r}.log") for r in (0, 1)}
        texts = {r: _read_until(p, "nobody-waits-for-this") for r, p in files.items()}
        for rank, text in texts.items():
            lines = [line for line in text.splitlines() if line.strip()]
            assert lines and all(line.startswith(f"[{name}:{rank} node 0 ") for line in lines), text
            for needle in ("debug-line", "info-line", "warning-line", "error-line", "logger-line"):
                assert needle in text, (rank, needle, text)
            assert "nobody-waits-for-this" in text and "'fail'" in text, text
        assert "first-rank-line" in texts[0] and "first-rank-line" not in texts[1]
        assert "last-rank-line" in texts[1] and "last-rank-line" not in texts[0]
    finally:
        g.stop()


DRIVER = """
import select
import sys
from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

class Chatty(Worker):
    def __init__(self):
        super().__init__()

    def talk(self):
        self.log_debug("debug-line")
        self.log_info("info-line")
        return self._rank

    def fail(self):
        raise RuntimeError("nobody-waits-for-this")

cluster = Cluster(num_nodes=1, temp_dir={temp!r}, num_cpus=2)
g = Chatty.create_group().launch(cluster, NodePlacementStrategy([0]), name="logt")
g.talk().wait()
g.fail()
# Ray forwards worker output to the driver asynchronously: the test says when it has seen it (30 s at most)
select.select([sys.stdin], [], [], 30)
g.stop()
cluster.shutdown()
print("DRIVER-DONE", flush=True)
"""


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts a Ray driver of its own")
@pytest.mark.timeout(240)
def test_info_and_failures_reach_the_driver_terminal(tmp_path):
    temp = tempfile.mkdtemp(prefix="rll")
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER.format(temp=temp)))
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RLINF_LOG_LEVEL", "RLINF_LAUNCHER")}
    env["RLINF_LAUNCHER"] = "ray"
    proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    failure_seen = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line)
            if "nobody-waits-for-this" in line:  # the last line the workers write
                failure_seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 200
        while not failure_seen.wait(0.2) and proc.poll() is None and time.monotonic() < deadline:
            pass  # bounded; the assertions below say what was missing
        try:
            proc.stdin.write("go\n")  # the driver may stop its group and end
            proc.stdin.close()
        except OSError:  # it ended already
            pass
        proc.wait(timeout=120)
        reader.join(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    out = "".join(lines)
    assert "DRIVER-DONE" in out, out[-4000:]
    info = [line for line in out.splitlines() if "info-line" in line]
    # one prefix, Ray's, naming the group, rank and node (not Ray's actor class), and the line itself
    assert info and info[0].startswith("(logt:0 node 0 pid=") and info[0].rstrip().endswith(" INFO info-line"), info
    assert "Rlinf_" not in out and "rlinf.worker.logt" not in out and "[logt:0" not in out, out[-4000:]
    assert "debug-line" not in out  # INFO is the default level
    failure = [line for line in out.splitlines() if "nobody-waits-for-this" in line]
    assert failure and "logt" in failure[0] and "'fail'" in failure[0], out[-4000:]
