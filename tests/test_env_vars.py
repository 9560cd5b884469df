"""Each ``RLINF_*`` variable of the README's table takes effect, in the driver and
in the workers it launches, and every ``RLINF_*`` variable set in the driver
reaches the workers (and their own child groups).

The embedded Ray's promises are checked in a program of their own, run with
``HOME`` set to an empty directory: token authentication is on (a client
without the token is refused, one with it is let in), nothing lands in
``~/.ray``, and ``RLINF_RAY_TEMP_DIR`` is where Ray keeps its files.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from rlinf.scheduler import Channel, CommTimeoutError, LaunchError, NodePlacementStrategy, Worker, WorkerMethodError

from launcher_marks import survives_worker_death
from p2p_helpers import Peer, run_on

pytestmark = survives_worker_death  # launches groups with their own environment on the session's Ray


def _worker_env(w):
    return {k: v for k, v in os.environ.items() if k.startswith("RLINF_")}


def _child_env(w):
    child = Peer.create_group().launch(name=None, placement_strategy=NodePlacementStrategy([0]))
    try:
        return run_on(child, 0, _worker_env).wait(timeout=60)[0]
    finally:
        child.stop()


def test_every_rlinf_variable_reaches_workers_and_their_children(launch, monkeypatch):
    values = {
        "RLINF_TIMEOUT": "123", "RLINF_LAUNCH_TIMEOUT": "77", "RLINF_ERROR_GRACE": "1.5", "RLINF_SPIN_US": "7",
        "RLINF_SHM_POOL_MB": "64", "RLINF_SHM_MAX_SEGMENTS": "9", "RLINF_CPU_SHM_MIN_BYTES": "4096",
        "RLINF_MPI_SPIN_US": "11", "RLINF_SOMETHING_OF_THE_USERS": "any value, with spaces = and ;",
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    driver = {k: v for k, v in os.environ.items() if k.startswith("RLINF_")}
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]))
    monkeypatch.delenv("RLINF_SOMETHING_OF_THE_USERS")  # what counts is the value at launch
    for env in g.run(__import__("p2p_helpers").ship(_worker_env)).wait(timeout=60):
        from rlinf.scheduler.base.config import WORKER_ONLY_ENV  # set by core per worker, not forwarded

        got = {k: v for k, v in env.items() if k not in WORKER_ONLY_ENV}
        assert got == {k: v for k, v in driver.items() if k not in WORKER_ONLY_ENV}
    child = run_on(g, 0, _child_env).wait(timeout=120)[0]
    for k, v in values.items():
        assert child.get(k) == v, f"{k} did not reach a worker's child group"


def test_rlinf_timeout_bounds_blocking_calls_in_the_driver(cluster, monkeypatch):
    ch = Channel.create("env_timeout_driver")
    monkeypatch.setenv("RLINF_TIMEOUT", "2")
    start = time.monotonic()
    with pytest.raises(CommTimeoutError):
        ch.get()  # no timeout=: RLINF_TIMEOUT applies
    took = time.monotonic() - start
    assert 1.5 <= took < 60, took


def test_rlinf_timeout_bounds_blocking_calls_in_workers(launch, monkeypatch):
    monkeypatch.setenv("RLINF_TIMEOUT", "2")
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]))
    monkeypatch.delenv("RLINF_TIMEOUT")  # the workers keep the value they were launched with

    def wait_for_nothing(w):
        start = time.monotonic()
        try:
            w.recv(w.worker_group_name, 1)  # rank 1 never sends; no timeout= given
        except CommTimeoutError as exc:
            return type(exc).__name__, str(exc), time.monotonic() - start
        return "returned", "", 0

    kind, message, took = run_on(g, 0, wait_for_nothing).wait(timeout=120)[0]
    assert kind == "CommTimeoutError" and f"{g.worker_group_name}:1" in message, message
    assert 1.5 <= took < 60, took


class SlowToStart(Worker):
    def __init__(self):
        super().__init__()
        time.sleep(120)


def test_rlinf_launch_timeout_bounds_a_launch(cluster, monkeypatch):
    monkeypatch.setenv("RLINF_LAUNCH_TIMEOUT", "3")
    start = time.monotonic()
    with pytest.raises(LaunchError, match="within 3 s"):
        SlowToStart.create_group().launch(cluster, NodePlacementStrategy([0]), name="env_slow_start")
    assert time.monotonic() - start < 60
    assert "env_slow_start" not in cluster.session.list_groups()


def _fail_now_or_wait(w, seconds, release):
    """Rank 0 fails at once; rank 1 returns after ``seconds``, or as soon as the file ``release`` exists."""
    if w._rank == 0:
        raise RuntimeError("rank 0 fails at once")
    end = time.monotonic() + seconds
    while time.monotonic() < end and not os.path.exists(release):  # bounded by ``seconds``
        time.sleep(0.05)
    return "slow rank done"


def test_rlinf_error_grace_sets_how_long_other_ranks_are_awaited(launch, monkeypatch, tmp_path):
    """Rank 0 fails at once, rank 1 finishes after 6 s: a long grace waits for it, a short one does not.

    After the short grace's call the test releases rank 1 (a file it polls for), so the group is free
    at once instead of after the rest of the 6 s."""
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]))
    times = {}
    for grace in ("30", "0.2"):
        monkeypatch.setenv("RLINF_ERROR_GRACE", grace)
        release = str(tmp_path / f"release-{grace}")
        start = time.monotonic()
        with pytest.raises(WorkerMethodError, match="rank 0 fails at once") as info:
            g.run(__import__("p2p_helpers").ship(_fail_now_or_wait), 6.0, release).wait(timeout=120)
        times[grace] = time.monotonic() - start
        assert info.value.rank == 0
        open(release, "w").close()
        g.run(__import__("p2p_helpers").ship(lambda w: None)).wait(timeout=60)  # rank 1 is free again
    assert times["30"] >= 5.5, times  # it waited for the slow rank's outcome
    assert times["0.2"] < times["30"] - 3, times  # it did not


def _cpu_while_receiving(w, n, gap):
    """Rank 1: CPU seconds this process spends over ``n`` receives that each wait ``gap`` s; rank 0 sends."""
    name = w.worker_group_name
    if w._rank == 0:
        for _ in range(n + 1):
            time.sleep(gap)
            w.send("tick", name, 1, timeout=60)
        return None
    w.recv(name, 0, timeout=60)  # the link is up before measuring
    start = time.process_time()
    for _ in range(n):
        w.recv(name, 0, timeout=60)
    return time.process_time() - start


def test_rlinf_spin_us_sets_how_long_a_waiting_receive_spins(launch, monkeypatch):
    cpu = {}
    for spin in ("0", "1000000"):  # never spin; spin up to a second (longer than each wait)
        monkeypatch.setenv("RLINF_SPIN_US", spin)
        g = launch(Peer, placement=NodePlacementStrategy([0, 0]))
        cpu[spin] = g.run(__import__("p2p_helpers").ship(_cpu_while_receiving), 5, 0.3).wait(timeout=120)[1]
        g.stop()
    # 5 waits of 0.3 s: spinning burns most of it even on a busy machine; sleeping in poll burns next to nothing
    assert cpu["1000000"] > 0.3, cpu
    assert cpu["0"] < cpu["1000000"] / 3, cpu


def _port_lock_files(w):
    from rlinf.scheduler.worker import lock

    port = w.acquire_free_port()
    return lock.lock_dir(), f"port-{port}.lock" in os.listdir(lock.lock_dir())


def test_rlinf_lock_dir_places_the_workers_node_locks(launch, monkeypatch, tmp_path):
    monkeypatch.setenv("RLINF_LOCK_DIR", str(tmp_path / "locks"))
    g = launch(Peer, placement=NodePlacementStrategy([0]))
    where, held = g.run(__import__("p2p_helpers").ship(_port_lock_files)).wait(timeout=60)[0]
    assert where == str(tmp_path / "locks") and held


def _memfd_mappings():
    with open("/proc/self/maps") as f:
        return sum("memfd:" in line for line in f)


def _shm_or_inline(w, size):
    """Rank 0 sends one buffer of ``size`` bytes to rank 1; returns rank 0's memfd mappings after it."""
    import numpy as np

    name = w.worker_group_name
    if w._rank == 0:
        before = _memfd_mappings()
        w.send(np.ones(size, dtype=np.uint8), name, 1, timeout=60)
        w.recv(name, 1, timeout=60)
        return _memfd_mappings() - before
    got = w.recv(name, 0, timeout=60)
    w.send("ok", name, 0, timeout=60)
    return int(got.sum())


@pytest.mark.parametrize("threshold, size, via_shm", [("65536", 1 << 20, True), ("4194304", 1 << 20, False)])
def test_rlinf_cpu_shm_min_bytes_picks_shared_memory_by_size(launch, monkeypatch, threshold, size, via_shm):
    monkeypatch.setenv("RLINF_CPU_SHM_MIN_BYTES", threshold)
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]))
    new_maps, total = g.run(__import__("p2p_helpers").ship(_shm_or_inline), size).wait(timeout=120)
    assert total == size  # the data arrived either way
    assert (new_maps > 0) == via_shm, f"sender gained {new_maps} memfd mappings (threshold {threshold}, {size} bytes)"


def test_rlinf_cpu_local_0_keeps_shared_memory_out(launch, monkeypatch):
    monkeypatch.setenv("RLINF_CPU_LOCAL", "0")
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]))
    new_maps, total = g.run(__import__("p2p_helpers").ship(_shm_or_inline), 1 << 22).wait(timeout=120)
    assert total == 1 << 22 and new_maps == 0


def _hold_many(w, count, size):
    """Rank 0 sends ``count`` buffers of ``size`` bytes; rank 1 keeps every one it gets.

    Rank 0 returns the most memfd mappings it had at once and how its sending ended;
    rank 1 returns whether everything it got is intact, and how many it got.
    """
    import numpy as np

    from rlinf.scheduler import CommTimeoutError

    name = w.worker_group_name
    if w._rank == 0:
        most, ended = _memfd_mappings(), "all sent"
        try:
            for i in range(count):
                w.send(np.full(size, i % 251, dtype=np.uint8), name, 1, timeout=15)
                most = max(most, _memfd_mappings())
        except CommTimeoutError as exc:
            ended = f"waited: {exc}"
        return most, ended
    held = []
    try:
        for _ in range(count):
            held.append(w.recv(name, 0, timeout=30))
    except CommTimeoutError:
        pass
    return all(int(h[0]) == i % 251 and h.nbytes == size for i, h in enumerate(held)), len(held)


@pytest.mark.timeout(240)
def test_rlinf_shm_limits_bound_the_shared_memory_a_sender_keeps(launch, monkeypatch):
    """The receiver holds every 1 MiB buffer it gets; with RLINF_SHM_MAX_SEGMENTS=4 and RLINF_SHM_POOL_MB=2
    the sender never maps more than 4 memfd segments, whatever happens past the limit: the buffers
    travel inline and all 24 arrive, or (the older rule) a send waits for the receiver, and says so."""
    monkeypatch.setenv("RLINF_SHM_MAX_SEGMENTS", "4")
    monkeypatch.setenv("RLINF_SHM_POOL_MB", "2")
    g = launch(Peer, placement=NodePlacementStrategy([0, 0]))
    (most, ended), (intact, received) = g.run(__import__("p2p_helpers").ship(_hold_many), 24, 1 << 20).wait(timeout=200)
    assert intact, "a held buffer was overwritten or cut short"
    assert 0 < most <= 4, f"the sender mapped {most} memfd segments at once with RLINF_SHM_MAX_SEGMENTS=4"
    if ended == "all sent":
        assert received == 24
    else:
        assert "shared-memory" in ended and 2 <= received < 24, (ended, received)
    print(f"sender's memfd mappings at most {most}; {ended[:80]}; receiver holds {received}")


# -- the embedded Ray: token authentication, nothing in ~/.ray, RLINF_RAY_TEMP_DIR ---------------------------------
EMBEDDED = """
    import os, subprocess, sys
    import ray
    from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

    class W(Worker):
        def env(self):
            return {k: v for k, v in os.environ.items() if k.startswith("RLINF_")}

    cluster = Cluster(log_to_driver=False)
    g = W.create_group().launch(cluster, NodePlacementStrategy([0]), name="embedded")
    print("WORKER_ENV", g.env().wait()[0].get("RLINF_MARK"), flush=True)
    print("SESSION", ray._private.worker._global_node.get_session_dir_path(), flush=True)
    print("TOKEN", bool(os.environ.get("RAY_AUTH_TOKEN")), flush=True)
    gcs = ray.get_runtime_context().gcs_address
    probe = "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); print('JOINED', flush=True)"
    clients = (("without", None), ("a wrong", "0" * 48), ("the", os.environ["RAY_AUTH_TOKEN"]))
    probes = []
    for label, token in clients:  # at once: each client is its own process, judged on its own output
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
        env["RAY_NUM_REDIS_GET_RETRIES"] = "3"  # a refused client gives up after 3 tries, not 20 (a second each)
        if token:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
        env["HOME"] = os.path.join(sys.argv[1], label.replace(" ", "_"))  # the client's own HOME: what Ray's
        os.makedirs(env["HOME"])                                          # client writes is not the driver's doing
        probes.append((label, subprocess.Popen([sys.executable, "-c", probe, gcs], env=env, text=True,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    for label, p in probes:
        try:
            out, err = p.communicate(timeout=90)
            joined, why = "JOINED" in out, (out + err)[-1500:]
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            joined, why = False, "timed out"  # never let in
        print("CLIENT", label, "token:", "joined" if joined else "refused", flush=True)
        print("WHY", label, why.replace(chr(10), " | "), flush=True)
    g.stop()
    cluster.shutdown()
"""


@pytest.mark.timeout(300)
def test_embedded_ray_uses_token_auth_its_temp_dir_and_never_home(tmp_path):
    home = tempfile.mkdtemp(prefix="rlhome")
    ray_dir = tempfile.mkdtemp(prefix="rlr")  # short: Ray's socket paths must fit in 107 bytes
    client_home = tempfile.mkdtemp(prefix="rlch")
    script = tmp_path / "embedded.py"
    script.write_text(textwrap.dedent(EMBEDDED))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "RLINF_LAUNCHER"))}
    env.update(HOME=home, RLINF_RAY_TEMP_DIR=ray_dir, RLINF_MARK="forwarded", PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run([sys.executable, str(script), client_home], env=env, timeout=280, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = proc.stdout
        assert proc.returncode == 0, out[-5000:]
        assert "WORKER_ENV forwarded" in out
        session = next(line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("SESSION"))
        assert session.startswith(ray_dir + os.sep), f"Ray's session {session} is not under RLINF_RAY_TEMP_DIR"
        assert "TOKEN True" in out
        assert "CLIENT the token: joined" in out, out[-3000:]  # so a refusal below is the token's doing
        for label in ("without", "a wrong"):
            assert f"CLIENT {label} token: refused" in out, out[-3000:]
            why = next(line for line in out.splitlines() if line.startswith(f"WHY {label} "))
            assert "AuthenticationError" in why or "InvalidAuthToken" in why, why
        written = [os.path.join(d, f) for d, _, files in os.walk(home) for f in files]
        assert not os.path.exists(os.path.join(home, ".ray")), f"~/.ray was written: {written}"
    finally:
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(client_home, ignore_errors=True)
        shutil.rmtree(ray_dir, ignore_errors=True)
