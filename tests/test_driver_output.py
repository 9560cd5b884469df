"""What a program's own terminal shows: worker lines without colour codes when it is not a terminal, and
no Ray warning for an RLinf-style async worker that uses a channel and a peer for the first time."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from launcher_marks import TEST_LAUNCHER

PROGRAM = """
import asyncio
import ray  # a program that imports Ray before rlinf starts its cluster (with token auth) still joins it
from rlinf.scheduler import Channel, Cluster, NodePlacementStrategy, Worker

class Rollout(Worker):
    async def produce(self, n):
        channel = self.connect_channel("outputs")  # the first lookup of the channel's host, in the event loop
        for i in range(n):
            channel.put(i)
            await asyncio.sleep(0)
        self.log_info("produced %d" % n)
        return n

cluster = Cluster(num_nodes=1, num_cpus=2)
outputs = Channel.create("outputs")
group = Rollout.create_group().launch(cluster, NodePlacementStrategy([0]), name="rollout")
print("RESULT", group.produce(3).wait(), [outputs.get(timeout=30) for _ in range(3)], flush=True)
import time; time.sleep(2)  # Ray forwards worker lines a moment later
"""


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts an embedded Ray cluster of its own")
@pytest.mark.timeout(150)
def test_async_worker_output_has_no_ray_warning_and_no_colour_codes():
    base = tempfile.mkdtemp(prefix="rlt")  # short: Ray's socket paths must fit in 107 bytes
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH", "RAY_COLOR"))}
    env.update(RLINF_RAY_TEMP_DIR=base, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, timeout=140)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "RESULT [3] [0, 1, 2]" in proc.stdout, out[-3000:]
    assert "produced 3" in out, out[-3000:]  # the worker's line reached the program's terminal
    assert "blocking ray.get inside async actor" not in out, out[-3000:]
    assert "\x1b[" not in out, out[-3000:]  # a pipe, not a terminal: no escape codes
    assert "RAY_AUTH_MODE=disabled" not in out, out[-3000:]  # no invitation to turn token auth off
