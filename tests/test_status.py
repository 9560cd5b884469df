"""``python -m rlinf.scheduler status`` against the suite's live Ray cluster, run as a separate process."""

import json
import os
import subprocess
import sys
import time

import pytest

from rlinf.scheduler import Channel, Worker
from rlinf.scheduler.runtime import status_server

from launcher_marks import TEST_LAUNCHER
from user_env import user_env

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

    # a user's shell joining a cluster with token authentication sets its address, mode and token
    full = user_env(RAY_ADDRESS=ray.get_runtime_context().gcs_address, RAY_AUTH_MODE="token",
                    RAY_AUTH_TOKEN=os.environ["RAY_AUTH_TOKEN"], **env)
    start = time.monotonic()
    # --timeout: generous, for a loaded machine (importing Ray alone can take seconds there)
    proc = subprocess.run([sys.executable, "-m", "rlinf.scheduler", "status", "--timeout", "30", *args],
                          capture_output=True, text=True, env=full, timeout=timeout)
    return proc, time.monotonic() - start


def _until_running(group, methods, timeout=60):
    """Until the group's worker 0 runs ``methods`` (asked directly, as the status command does)."""
    deadline = time.monotonic() + timeout
    while True:
        calls = [c["method"] for c in status_server.query(group._records[0].status, 5)["calls"]]
        if calls == methods or time.monotonic() > deadline:
            assert calls == methods
            return
        time.sleep(0.05)


def test_status_lists_groups_calls_and_channels(cluster, launch):
    sync = launch(Sleeper, name="status_sync")
    aio = launch(AsyncSleeper, name="status_async")
    ch = Channel.create("status_chan")
    for i in range(3):
        ch.put(i, key="full")
    ch.put("t", key=("a", 1))  # a tuple key, shown as Python writes it
    parked = sync.park(ch, "empty")  # a getter parked on the host until the item below arrives
    napping = [aio.nap(30), aio.nap(30)]  # two concurrent calls on one async worker
    _until_running(sync, ["park"])
    _until_running(aio, ["nap", "nap"])

    proc, _ = _status("--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    snap = json.loads(proc.stdout)
    assert snap["launcher"] == "ray"
    groups = {g["name"]: g for g in snap["groups"]}
    g = groups["status_sync"]
    assert (g["class"], g["size"], g["nodes"]) == ("Sleeper", 1, [0])
    w = g["workers"][0]
    info = sync.worker_info_list[0]
    assert (w["rank"], w["pid"], w["node"], w["alive"], w["state"]) == (0, info.pid, 0, True, "alive")
    assert [c["method"] for c in w["calls"]] == ["park"] and w["calls"][0]["running_s"] > 0
    a = groups["status_async"]["workers"][0]
    assert [c["method"] for c in a["calls"]] == ["nap", "nap"], a
    chans = {c["name"]: c for c in snap["channels"]}
    keys = {k["key"]: k for k in chans["status_chan"]["keys"]}
    assert keys["'full'"]["items"] == 3 and keys["'empty'"]["getters"] == 1, keys
    assert keys["('a', 1)"]["items"] == 1, keys
    assert chans["status_chan"]["host"]["alive"] is True

    # the readable form, and the worker still answers the status while its call keeps running
    proc, _ = _status()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "status_sync/0" in proc.stdout and "park (" in proc.stdout and "status_chan" in proc.stdout
    ch.put("x", key="empty")
    assert parked.wait(timeout=30) == ["x"]


def test_status_finds_the_embedded_cluster_of_a_driver_without_ray_address(cluster, launch):
    """A driver that started an embedded cluster is the only one that knows its address and its random
    token: it publishes both (mode 0600) in the private status directory, where the command finds them."""
    launch(Sleeper, name="status_embedded")
    directory = os.environ["RLINF_STATUS_DIR"]
    (mine,) = [n for n in os.listdir(directory) if n.startswith("ray-") and n.endswith(f"-{os.getpid()}.json")]
    assert os.stat(os.path.join(directory, mine)).st_mode & 0o777 == 0o600
    # a user's shell: none of the driver's Ray settings (the driver keeps them in its own environment), nor
    # hatch.toml's (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 hid that Ray's client took 127.0.0.1 for the
    # machine's own address, where the embedded cluster does not listen)
    env = user_env()
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rlinf.scheduler", "status", "--json", "--timeout", "30"],
                          capture_output=True, text=True, env=env, timeout=60)
    took = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    # nothing of Ray's own logging (e.g. its C++ client refused for a missing auth mode) reaches the terminal
    assert ".cc:" not in proc.stderr and "InvalidAuthToken" not in proc.stderr, proc.stderr[-3000:]
    # found at once, not after waiting out --timeout 30 (1.0 s on an idle 2-core machine, most of it importing
    # Ray, which a loaded one can make several times slower)
    assert took < 20, f"status took {took:.1f} s"
    snap = json.loads(proc.stdout)
    assert f"the embedded cluster of pid {os.getpid()}" in snap["address"], snap["address"]
    assert "status_embedded" in {g["name"] for g in snap["groups"]}


def _ray_node_address() -> str:
    """The address Ray's client takes for this machine when it is not told to stay on loopback: the one
    that routes to the outside (Ray's own probe: a UDP socket connected to a public address), else loopback."""
    import socket

    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("8.8.8.8", 80))  # UDP: nothing is sent
        return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


def test_this_machine_has_an_address_for_ray_to_rewrite_loopback_to():
    """The embedded-cluster status test above is a test of the loopback rewrite only where the machine has
    an address besides loopback; on one without, the network-namespace test below runs instead."""
    address = _ray_node_address()
    if address.startswith("127."):
        pytest.skip("this machine routes nowhere but loopback: test_status_in_a_namespace_with_an_address covers it")
    assert not address.startswith("127.")


EMBEDDED_PROGRAM = """
import json, subprocess, sys
from rlinf.scheduler import Cluster, Worker

class Idle(Worker):
    def ping(self):
        return 1

group = Idle.create_group().launch(Cluster(num_nodes=1), name="netns_embedded")
group.ping().wait()
env = dict(__import__("os").environ)
for key in ("RAY_AUTH_TOKEN", "RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"):
    env.pop(key, None)  # what the driver set for itself: the user's shell has none of it
p = subprocess.run([sys.executable, "-m", "rlinf.scheduler", "status", "--json", "--timeout", "30"],
                   capture_output=True, text=True, env=env, timeout=60)
print("STATUS", json.dumps({"code": p.returncode, "out": p.stdout, "err": p.stderr[-2000:]}), flush=True)
"""


@pytest.mark.timeout(240)
def test_status_in_a_namespace_with_an_address(tmp_path):
    """Where this machine has no address but loopback, a network namespace with one (and a default route,
    as a workstation has) is that machine: a driver there starts its embedded cluster, and the status
    command, run as a user runs it, finds it."""
    import netns

    if not _ray_node_address().startswith("127."):
        pytest.skip("this machine has an address besides loopback: the embedded-cluster status test covers it")
    reason = netns.unavailable_reason()
    if reason:
        pytest.skip(reason)
    program = tmp_path / "program.py"
    program.write_text(EMBEDDED_PROGRAM)
    hosts = netns.NetnsHosts(1)
    try:
        hosts.create()
        env = user_env(RLINF_STATUS_DIR=str(tmp_path / "status"), RLINF_RAY_TEMP_DIR=hosts.temp_dir)
        proc = hosts.popen(0, [sys.executable, str(program)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        out = proc.communicate(timeout=200)[0]
    finally:
        hosts.stop()
    assert proc.returncode == 0, out[-4000:]
    result = json.loads(next(ln for ln in out.splitlines() if ln.startswith("STATUS "))[len("STATUS "):])
    assert result["code"] == 0, result
    assert "netns_embedded" in {g["name"] for g in json.loads(result["out"])["groups"]}


def test_status_lists_every_embedded_cluster_and_picks_one_by_pid(cluster, launch, tmp_path):
    """Two programs with an embedded cluster each: the newest is shown, the other named with the option
    that shows it (``--pid``).  The second program here is a plain process whose published file names the
    suite's cluster: the status command finds programs through these files and nothing else."""
    import socket

    from rlinf.scheduler.tools import status_dir

    launch(Sleeper, name="status_two")
    directory = os.environ["RLINF_STATUS_DIR"]
    other = subprocess.Popen(["sleep", "60"], cwd=str(tmp_path))
    path = os.path.join(directory, f"ray-{socket.gethostname()}-{other.pid}.json")
    try:
        started = status_dir._started(other.pid)
        import ray

        status_dir.publish(os.path.basename(path), {
            "launcher": "ray", "pid": other.pid, "host": socket.gethostname(), "boot": status_dir._boot(),
            "started": started, "address": ray.get_runtime_context().gcs_address,
            "token": os.environ["RAY_AUTH_TOKEN"]}, "ray")
        os.utime(path, (time.time() + 5, time.time() + 5))  # the newest
        env = user_env()
        command = [sys.executable, "-m", "rlinf.scheduler", "status", "--timeout", "30"]
        shown = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        assert shown.returncode == 0, shown.stderr[-3000:]
        assert f"the embedded cluster of pid {other.pid}, sleep 60" in shown.stdout, shown.stdout
        assert (f"2 programs run an embedded Ray cluster on this machine; shown: the newest.  Also running: "
                f"pid {os.getpid()} (") in shown.stdout, shown.stdout
        assert "python -m rlinf.scheduler status --pid PID" in shown.stdout
        picked = subprocess.run(command + ["--json", "--pid", str(os.getpid())], capture_output=True, text=True,
                                env=env, timeout=60)
        assert picked.returncode == 0, picked.stderr[-3000:]
        snap = json.loads(picked.stdout)
        assert f"the embedded cluster of pid {os.getpid()}" in snap["address"] and snap["notes"] == [], snap
        assert "status_two" in {g["name"] for g in snap["groups"]}
        wrong = subprocess.run(command + ["--pid", "1"], capture_output=True, text=True, env=env, timeout=60)
        assert wrong.returncode == 1 and "no embedded Ray cluster of pid 1 runs on this machine" in wrong.stderr
        assert f"pid {other.pid} (sleep 60)" in wrong.stderr, wrong.stderr
    finally:
        other.kill()
        other.wait(10)
        if os.path.exists(path):
            os.unlink(path)


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
                          env=dict(env, RAY_ADDRESS=f"127.0.0.1:{port}",
                                   RLINF_STATUS_DIR=os.path.join(os.path.dirname(__file__), "no-such-dir")),
                          timeout=60)
    closed.close()
    assert proc.returncode == 1 and f"127.0.0.1:{port}" in proc.stderr, proc.stderr


def test_status_listener_refuses_a_wrong_token(launch):
    g = launch(Sleeper, name="status_token")
    endpoint = g._records[0].status
    assert status_server.query(endpoint, 5)["pid"] == g.worker_info_list[0].pid
    with pytest.raises(ConnectionError):
        status_server.query(dict(endpoint, token="00" * 32), 5)
    g.stop()
    # the process is gone: refused.  On Ray, stop() kills the actors without waiting for their
    # processes to exit, so the listener may answer for a moment longer (bounded here)
    end = time.monotonic() + 15
    while True:
        try:
            status_server.query(endpoint, 5)
        except OSError:
            break
        assert time.monotonic() < end, "the stopped worker's status listener still answers after 15 s"
        time.sleep(0.2)


MPI_PROGRAM = '''
import json, os, subprocess, sys, time
from rlinf.scheduler import Cluster, Worker

class Sleeper(Worker):
    def nap(self, flag):
        deadline = time.monotonic() + 90
        while not os.path.exists(flag) and time.monotonic() < deadline:  # runs until the status was taken
            time.sleep(0.05)
        return 1

flag, where = sys.argv[1], sys.argv[2]
g = Sleeper.create_group().launch(Cluster(), name="mpi_status")
running = g.nap(flag)
directory = os.environ["RLINF_STATUS_DIR"]
(mine,) = [os.path.join(directory, n) for n in os.listdir(directory) if n.startswith("mpi-")]
touched = os.stat(mine).st_mtime
time.sleep(1.5)  # RLINF_STATUS_REFRESH=0.5: rank 0 keeps its file fresh
assert os.stat(mine).st_mtime > touched, "rank 0 did not refresh its status file"
# a job killed with its node on another host left its file in the shared directory an hour ago
with open(mine) as f:
    body = json.load(f)
body.update(host="deadhost", pid=1)
stale = os.path.join(directory, "mpi-deadhost-1.json")
with open(stale, "w") as f:
    json.dump(body, f)
os.utime(stale, (time.time() - 3600, time.time() - 3600))
env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and not k.startswith(("PMI_", "MPI", "HYDRA"))}
command = [sys.executable, "-m", "rlinf.scheduler", "status", "--json"]
if where == "elsewhere":  # another hostname, and rank 0's pid out of sight: as from another node
    command = ["unshare", "--uts", "--pid", "--fork", "sh", "-c", 'hostname elsewhere && exec "$@"', "sh"] + command
p = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
print("STATUS", json.dumps({"code": p.returncode, "out": p.stdout, "err": p.stderr[-2000:]}))
os.unlink(stale)
open(flag, "w").close()
assert running.wait() == [1]
'''


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "--uts", "--pid", "--fork", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts an MPI job of its own")
@pytest.mark.timeout(200)
@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_status_of_an_mpi_job(tmp_path, where):
    """From rank 0's machine, and from another one that shares the status directory (``RLINF_STATUS_DIR``
    on a shared filesystem): there rank 0's pid cannot be checked, and the job is listed all the same."""
    from test_mpi import MPIEXEC, mpirun

    if MPIEXEC is None:
        pytest.skip("needs mpi4py and an mpiexec (pip install mpi4py mpich)")
    if where == "elsewhere" and not _can_unshare():
        pytest.skip("needs unshare with UTS and PID namespaces (root) to look from another hostname")
    program = tmp_path / "program.py"
    program.write_text(MPI_PROGRAM)
    status_dir = tmp_path / "status"
    code, out, _ = mpirun(2, [str(program), str(tmp_path / "flag"), where], timeout=150,
                          RLINF_STATUS_DIR=str(status_dir), RLINF_STATUS_REFRESH="0.5")
    assert code == 0, out[-4000:]
    line = next(ln for ln in out.splitlines() if ln.startswith("STATUS "))
    result = json.loads(line[len("STATUS "):])
    assert result["code"] == 0, result
    snap = json.loads(result["out"])
    assert snap["launcher"] == "mpi"
    (g,) = [g for g in snap["groups"] if g["name"] == "mpi_status"]
    w = g["workers"][0]
    assert w["alive"] is True and [c["method"] for c in w["calls"]] == ["nap"], w
    # the dead host's job: skipped, said so, not listed as a job whose workers do not answer
    assert "deadhost" not in snap["address"] and len(snap["groups"]) == 1, snap
    assert any("mpi-deadhost-1.json" in n and "refreshed it for 36" in n for n in snap["notes"]), snap["notes"]
    assert oct(os.stat(status_dir).st_mode & 0o777) == "0o700"
    assert os.listdir(status_dir) == []  # the job removed its file as it ended


def test_status_says_why_it_skips_the_file_of_a_job_gone_with_its_node(tmp_path, monkeypatch):
    """Only a stale file from another node in a shared status directory: nothing is listed, and the
    reason names the file and how long its rank 0 has been silent, judged by the job's own refresh
    interval (written in the file), not this process's."""
    pytest.importorskip("rlinf.mpi")
    from rlinf.mpi import status as mpi_status

    directory = tmp_path / "status"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("RLINF_STATUS_DIR", str(directory))
    monkeypatch.setenv("RLINF_STATUS_REFRESH", "3600")  # this reader's own interval must not matter
    body = {"launcher": "mpi", "pid": 1, "host": "deadhost", "refresh": 30.0, "groups": []}
    stale = directory / "mpi-deadhost-1.json"
    stale.write_text(json.dumps(body))
    os.utime(stale, (time.time() - 400, time.time() - 400))  # ten of the job's 30 s intervals and more
    with pytest.raises(RuntimeError, match=r"no MPI job running; skipped mpi-deadhost-1\.json: .* for 40\d s"):
        mpi_status.running_groups(5)
    os.utime(stale)  # fresh again: listed (its workers then say whether they answer)
    found = mpi_status.running_groups(5)
    assert found is not None and "1 on deadhost" in found["address"] and found["notes"] == []


def test_the_file_of_a_killed_job_whose_pid_was_reused_is_not_a_running_job(tmp_path, monkeypatch):
    """A job killed with mpiexec leaves its file; once its rank 0's pid is another process's, the pid
    alone would bring the job back.  The start time written beside it tells them apart, and rank 0 of
    the next job removes the leftover."""
    pytest.importorskip("rlinf.mpi")
    import socket

    from rlinf.mpi import status as mpi_status
    from rlinf.scheduler.tools import status_dir

    directory = tmp_path / "status"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("RLINF_STATUS_DIR", str(directory))
    host = socket.gethostname()
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        started = status_dir._started(stranger.pid)
        assert started is not None
        group = {"name": "doomed", "class": "W", "workers": []}
        reused = {"launcher": "mpi", "pid": stranger.pid, "host": host, "boot": status_dir._boot(),
                  "started": started - 1, "refresh": 30.0, "groups": [group]}
        leftover = directory / f"mpi-{host}-{stranger.pid}.json"
        leftover.write_text(json.dumps(reused))
        assert mpi_status.running_groups(5) is None  # not a running job: nothing is listed
        leftover.write_text(json.dumps(dict(reused, started=started)))  # the same process: it runs
        assert [g.name for g in mpi_status.running_groups(5)["groups"]] == ["doomed"]
        leftover.write_text(json.dumps(dict(reused, boot="an earlier boot")))
        assert mpi_status.running_groups(5) is None
        status_dir.remove_leftovers(str(directory), "mpi")
        assert not leftover.exists()
    finally:
        stranger.kill()
        stranger.wait(10)


@pytest.mark.skipif(os.getuid() != 0, reason="needs root, to listen as another user")
def test_status_does_not_send_the_token_to_a_port_another_user_took(tmp_path, monkeypatch):
    """The embedded cluster a driver published is gone while the driver runs on, and another user
    listens on its port now: the status command refuses to join there with the cluster's token."""
    import shutil
    import socket

    pytest.importorskip("rlinf.ray")
    from rlinf.ray import status as ray_status
    from rlinf.scheduler.tools import status_dir

    python = shutil.which("python3", path="/usr/bin:/bin")  # one the other user may run (not under /root)
    if python is None:
        pytest.skip("needs a system python3 for the other user's listener")
    directory = tmp_path / "status"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("RLINF_STATUS_DIR", str(directory))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    squatter = subprocess.Popen(
        [python, "-c", "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
                       "print(s.getsockname()[1], flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True, user=65534, cwd="/")
    try:
        port = int(squatter.stdout.readline())
        status_dir.publish(f"ray-{socket.gethostname()}-{os.getpid()}.json",
                           {"launcher": "ray", **status_dir.process_mark(), "address": f"127.0.0.1:{port}",
                            "token": "the-cluster-token"}, "ray")
        with pytest.raises(RuntimeError, match="uid 65534 listens there now: not sending it"):
            ray_status.running_groups(5)
    finally:
        squatter.kill()
        squatter.wait(10)
