"""Under ``mpiexec``, a worker's print() lines reach the terminal before what the driver prints after the call.

Every rank writes to a pipe that ``mpiexec`` reads; Python buffers a pipe in
blocks, so without line buffering a worker's lines came out when the job
ended, after the driver's later lines.
"""

from __future__ import annotations

import pytest

import subprocess
import sys

from test_mpi import MPIEXEC, ROOT, _env, program

pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="needs mpi4py and an mpiexec (pip install mpi4py mpich)")


@pytest.mark.timeout(200)
def test_worker_lines_come_before_the_drivers_next_line(tmp_path):
    path = program(tmp_path, """
        from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

        class Talker(Worker):
            def __init__(self):
                super().__init__()

            def talk(self, step):
                print(f"worker {self._rank} says {step}")

        cluster = Cluster(num_nodes=1)
        group = Talker.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="talkers")
        for step in range(3):
            group.talk(step).wait(timeout=60)
            print(f"driver after {step}")
        group.stop()
    """)
    env = _env()
    env.pop("PYTHONUNBUFFERED")  # a user's ranks write to block-buffered pipes
    proc = subprocess.run([MPIEXEC, "-n", "3", sys.executable, "-m", "rlinf.mpi", path], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=180)
    code, out = proc.returncode, proc.stdout
    assert code == 0, out[-3000:]
    lines = out.splitlines()
    for step in range(3):
        driver = lines.index(f"driver after {step}")
        for rank in (0, 1):
            said = lines.index(f"worker {rank} says {step}")
            assert said < driver, f"worker {rank}'s line of step {step} came after the driver's:\n{out}"
