"""``python -m rlinf.scheduler status`` against the suite's live Ray cluster, run as a separate process."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from rlinf.scheduler import Channel, Worker
from rlinf.scheduler import status_server

from launcher_marks import TEST_LAUNCHER

pytestmark = pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="runs the status command against the session's Ray cluster")


class Sleeper(Worker):
    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self._rank

    def park(self, channel, key):
        return channel.get(key=key, timeout=60)


class AsyncSleeper(Worker):
    async def nap(self, seconds: float) -> int:
        import asyncio

        await asyncio.sleep(seconds)
        return self._rank


def _status(*args, timeout=60, **env):
    import ray

    full = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address, **env)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rlinf.scheduler", "status", *args], capture_output=True, text=True,
                          env=full, timeout=timeout)
    return proc, time.monotonic() - start


def test_status_lists_groups_calls_and_channels(cluster, launch):
    sync = launch(Sleeper, name="status_sync")
    aio = launch(AsyncSleeper, name="status_async")
    ch = Channel.create("status_chan")
    for i in range(3):
        ch.put(i, key="full")
    parked = sync.park(ch, "empty")  # a getter parked on the host until the item below arrives
    napping = [aio.nap(30), aio.nap(30)]  # two concurrent calls on one async worker
    time.sleep(1.5)  # the calls start and have run for a while

    proc, took = _status("--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    snap = json.loads(proc.stdout)
    assert snap["launcher"] == "ray"
    groups = {g["name"]: g for g in snap["groups"]}
    g = groups["status_sync"]
    assert (g["class"], g["size"], g["nodes"]) == ("Sleeper", 1, [0])
    w = g["workers"][0]
    info = sync.worker_info_list[0]
    assert (w["rank"], w["pid"], w["node"], w["alive"], w["state"]) == (0, info.pid, 0, True, "alive")
    assert [c["method"] for c in w["calls"]] == ["park"] and w["calls"][0]["running_s"] >= 1.0
    a = groups["status_async"]["workers"][0]
    assert [c["method"] for c in a["calls"]] == ["nap", "nap"], a
    chans = {c["name"]: c for c in snap["channels"]}
    keys = {k["key"]: k for k in chans["status_chan"]["keys"]}
    assert keys["'full'"]["items"] == 3 and keys["'empty'"]["getters"] == 1, keys
    assert chans["status_chan"]["host"]["alive"] is True

    # the readable form, and the worker still answers the status while its call keeps running
    proc, _ = _status()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "status_sync/0" in proc.stdout and "park (" in proc.stdout and "status_chan" in proc.stdout
    ch.put("x", key="empty")
    assert parked.wait(timeout=30) == ["x"]


def test_status_says_nothing_runs(cluster):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "rlinf.scheduler", "status"], capture_output=True, text=True,
                          env=dict(env, RLINF_STATUS_DIR=os.path.join(os.path.dirname(__file__), "no-such-dir")),
                          timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().count("\n") == 0 and "no running rlinf cluster" in proc.stderr, proc.stderr
    closed = status_server.socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]  # bound, never listening: nothing answers there
    proc = subprocess.run([sys.executable, "-m", "rlinf.scheduler", "status"], capture_output=True, text=True,
                          env=dict(env, RAY_ADDRESS=f"127.0.0.1:{port}"), timeout=60)
    closed.close()
    assert proc.returncode == 1 and f"127.0.0.1:{port}" in proc.stderr, proc.stderr


def test_status_listener_refuses_a_wrong_token(launch):
    g = launch(Sleeper, name="status_token")
    endpoint = g._records[0].status
    assert status_server.query(endpoint, 5)["pid"] == g.worker_info_list[0].pid
    with pytest.raises(ConnectionError):
        status_server.query(dict(endpoint, token="00" * 32), 5)
    g.stop()
    with pytest.raises(OSError):  # the process is gone: refused at once
        status_server.query(endpoint, 5)
