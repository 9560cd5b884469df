"""Worker lines reach the driver's output in order with the driver's own lines.

Every line a worker wrote during a group call (stdout, stderr, the ``rlinf``
logger; a line Ray deduplicates across workers as well) is printed by the
driver before ``wait()`` or ``await`` returns that call's results, and output
that is not a terminal carries no escape codes.  A driver that does not take
its workers' output (``log_to_driver=False``) does not wait for it.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from rlinf.scheduler import NodePlacementStrategy, Worker

from launcher_marks import TEST_LAUNCHER

PROGRAM = """
import asyncio
import sys
from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

class Talker(Worker):
    def hello(self, tag):
        print(f"stdout line of rank {self._rank} in {tag}")
        print(f"stderr line of rank {self._rank} in {tag}", file=sys.stderr)
        self.log_info(f"logger line of rank {self._rank} in {tag}")
        print(f"the same line on every rank in {tag}")  # Ray deduplicates it across the ranks
        return self._rank

    def quiet(self):
        return None

cluster = Cluster(num_nodes=1, num_cpus=2)
group = Talker.create_group().launch(cluster, NodePlacementStrategy([0, 0, 0]), name="talkers")
group.quiet().wait(timeout=60)
for call in ("call-a", "call-b"):
    assert group.hello(call).wait(timeout=60) == [0, 1, 2]
    print(f"driver after {call}")

async def main():
    assert await asyncio.wait_for(group.hello("call-c").async_wait(), 60) == [0, 1, 2]
    print("driver after call-c")

asyncio.run(main())
cluster.shutdown()
"""


def _run_program() -> str:
    base = tempfile.mkdtemp(prefix="rlt")  # short: Ray's socket paths must fit in 107 bytes
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_ADDRESS", "RAY_AUTH", "RAY_COLOR", "RAY_DEDUP", "RLINF_LOG_SYNC"))}
    env.update(RLINF_RAY_TEMP_DIR=base, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env, timeout=140)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts an embedded Ray cluster of its own")
@pytest.mark.timeout(150)
def test_worker_lines_come_before_the_driver_line_that_follows_the_call():
    out = _run_program()
    lines = out.splitlines()

    def ranks_before(call, kind):
        """How many ranks' ``kind`` lines of ``call`` are printed before the driver's line after ``call``: of
        lines that differ only in numbers Ray prints the first, then one ``[repeated Nx across cluster]`` line
        for the N others."""
        driver = next((i for i, line in enumerate(lines) if f"driver after {call}" in line), None)
        assert driver is not None, f"the driver's line after {call} is missing:\n{out[-3000:]}"
        count = 0
        for line in lines[:driver]:
            if kind in line and f"in {call}" in line:
                repeated = re.search(r"\[repeated (\d+)x across cluster\]", line)
                count += int(repeated.group(1)) if repeated else 1
        return count

    for call in ("call-a", "call-b", "call-c"):
        for kind in ("stdout line of rank", "stderr line of rank", "logger line of rank", "the same line on every rank"):
            assert ranks_before(call, kind) == 3, f"{kind} ... {call}:\n{out[-3000:]}"
    assert "\x1b[" not in out, out[-3000:]  # a pipe, not a terminal: no escape codes
    assert "rlinf_log_mark" not in out, out[-3000:]  # the workers' sync marks are not shown


class Printer(Worker):
    def hello(self):
        print("a line nobody forwards")
        return self._rank


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="the suite's Ray cluster is the one without log_to_driver")
@pytest.mark.timeout(60)
def test_a_driver_without_worker_output_does_not_wait_for_it(launch, monkeypatch):
    monkeypatch.setenv("RLINF_LOG_SYNC_TIMEOUT", "30")  # a wait for lines that never come would show
    group = launch(Printer, placement=NodePlacementStrategy([0]))
    start = time.monotonic()
    assert group.hello().wait(timeout=60) == [0]
    assert time.monotonic() - start < 15
