"""What a program's own terminal shows: worker lines without colour codes when it is not a terminal, and
no Ray warning for an RLinf-style async worker that uses a channel and a peer for the first time."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

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
import select, sys
select.select([sys.stdin], [], [], 30)  # Ray forwards worker lines a moment later: the test says when it saw them
"""


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts an embedded Ray cluster of its own")
@pytest.mark.timeout(150)
def test_async_worker_output_has_no_ray_warning_and_no_colour_codes():
    base = tempfile.mkdtemp(prefix="rlt")  # short: Ray's socket paths must fit in 107 bytes
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH", "RAY_COLOR"))}
    env.update(RLINF_RAY_TEMP_DIR=base, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    lines = {"out": [], "err": []}
    seen = threading.Event()

    def read(stream, into):
        for line in stream:
            into.append(line)
            if "produced 3" in line:  # the worker's line, the last one it writes
                seen.set()

    readers = [threading.Thread(target=read, args=(proc.stdout, lines["out"]), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, lines["err"]), daemon=True)]
    for r in readers:
        r.start()
    try:
        deadline = time.monotonic() + 120
        while not seen.wait(0.2) and proc.poll() is None and time.monotonic() < deadline:
            pass  # bounded; the assertions below say what was missing
        try:
            proc.stdin.write("go\n")
            proc.stdin.close()
        except OSError:  # it ended already
            pass
        proc.wait(timeout=60)
        for r in readers:
            r.join(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        shutil.rmtree(base, ignore_errors=True)
    proc.stdout, proc.stderr = "".join(lines["out"]), "".join(lines["err"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "RESULT [3] [0, 1, 2]" in proc.stdout, out[-3000:]
    assert "produced 3" in out, out[-3000:]  # the worker's line reached the program's terminal
    assert "blocking ray.get inside async actor" not in out, out[-3000:]
    assert "\x1b[" not in out, out[-3000:]  # a pipe, not a terminal: no escape codes
    assert "RAY_AUTH_MODE=disabled" not in out, out[-3000:]  # no invitation to turn token auth off
