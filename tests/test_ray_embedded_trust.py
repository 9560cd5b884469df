"""Whom an embedded Ray cluster (``Cluster()`` with no cluster running) trusts: its files live in a
directory no other user made or can enter, and its ports are on loopback.

Each test runs its own driver program, with the default temp dir logic (the suite's shared cluster
passes ``temp_dir=``): ``TMPDIR`` points at a fresh directory with /tmp's mode (1777), where a process
of uid ``nobody`` plays the other user of the machine.
"""

import errno
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

from launcher_marks import TEST_LAUNCHER

pytestmark = [
    pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="starts embedded Ray clusters"),
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="becoming another user needs root"),
]

NOBODY = 65534

DRIVER = textwrap.dedent("""
    import json, os, select, sys
    import psutil
    from rlinf.scheduler import Cluster, Worker

    class Pid(Worker):
        def pid(self):
            return os.getpid()

    try:
        cluster = Cluster(log_to_driver=False, num_cpus=2)
    except Exception as exc:
        print(json.dumps({"refused": f"{type(exc).__name__}: {exc}", "permission": isinstance(exc, PermissionError)}),
              flush=True)
        sys.exit(0)
    import ray

    group = Pid.create_group().launch(cluster, name="trust")
    worker = group.pid().wait()[0]
    session = ray._private.worker._global_node.get_session_dir_path()
    listening = []  # every TCP listener and unconnected UDP socket of this driver and its process tree
    for proc in [psutil.Process(), *psutil.Process().children(recursive=True)]:
        try:
            name, conns = proc.name(), proc.net_connections(kind="inet")
        except psutil.Error:
            continue
        for c in conns:
            if c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr):
                listening.append([proc.pid, name, c.laddr.ip, c.laddr.port])
    watchdog_env = None  # the names in the environment of the watchdog this driver started
    for proc in psutil.Process().children():
        if "rlinf.ray.watchdog" in " ".join(proc.cmdline()):
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                watchdog_env = sorted(e.split(b"=", 1)[0].decode() for e in f.read().split(b"\\0") if e)
    print(json.dumps({"session": session, "worker": worker, "listening": listening, "watchdog_env": watchdog_env,
                      "sockets": sorted(os.listdir(os.path.join(session, "sockets")))}), flush=True)
    select.select([sys.stdin], [], [], 60)  # the test looks at the running cluster, then says "done"
    group.stop()
    cluster.shutdown()
""")


def _as_nobody(code: str) -> dict:
    """Run ``code`` (which sets ``out``) in a child that became uid ``nobody``; its ``out``."""
    prog = (f"import json, os\nos.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\nout = {{}}\n"
            f"{code}\nprint(json.dumps(out))")
    done = subprocess.run([sys.executable, "-S", "-c", prog], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _driver(base: str, **extra: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_AUTH", "RAY_ADDRESS", "RLINF_LAUNCHER", "RLINF_RAY_TEMP_DIR", "RLINF_STATUS"))}
    env.update(TMPDIR=base, PYTHONUNBUFFERED="1", XDG_RUNTIME_DIR="", **extra)
    return subprocess.Popen([sys.executable, "-c", DRIVER], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _first_line(proc: subprocess.Popen, timeout: float) -> dict:
    """The driver's JSON line (bounded wait); its stderr if it ends without one."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if not line:
        proc.kill()
        raise AssertionError(f"no answer from the driver within {timeout} s: {proc.communicate(timeout=30)[1][-3000:]}")
    return json.loads(line)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)  # the watchdog stops the cluster of a killed driver
    proc.communicate(timeout=30)


@pytest.fixture
def shared_tmp():
    """A directory like /tmp: everyone may create entries, only their owner may remove them."""
    base = tempfile.mkdtemp(prefix="rlt")  # short: Ray's socket paths must fit in 107 bytes
    os.chmod(base, 0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.timeout(120)
def test_a_directory_another_user_planted_is_refused(shared_tmp):
    """Another user made the default directory first (at the old name and at the new one), or planted
    a symlink there: the driver refuses, saying why and what to do, and never writes in theirs."""
    mine = os.path.join(shared_tmp, f"rlinf-ray-{os.geteuid()}")
    bait = os.path.join(shared_tmp, "bait")
    _as_nobody(f"for p in ({os.path.join(shared_tmp, 'rlinf-ray')!r}, {mine!r}, {bait!r}): os.mkdir(p, 0o777); "
               "os.chmod(p, 0o777)")
    for plant, why in (("directory", f"owned by uid {NOBODY}"), ("symlink", "is a symbolic link")):
        if plant == "symlink":
            os.rmdir(mine)  # the administrator removes the directory; the other user plants a link instead
            _as_nobody(f"os.symlink({bait!r}, {mine!r})")
        proc = _driver(shared_tmp)
        try:
            answer = _first_line(proc, 60)
        finally:
            _stop(proc)
        assert "refused" in answer, f"the driver started a cluster in another user's directory: {answer}"
        assert answer["permission"] and why in answer["refused"], answer
        assert mine in answer["refused"] and "temp_dir=" in answer["refused"], answer  # where, and what to do
        for theirs in (os.path.join(shared_tmp, "rlinf-ray"), mine, bait):
            assert not os.path.isdir(theirs) or os.listdir(theirs) == [], f"the driver wrote in {theirs}"


@pytest.mark.timeout(150)
def test_embedded_cluster_is_private_to_its_user_and_listens_on_loopback(shared_tmp):
    """The cluster's files are in a 0700 directory of the user (so nobody cannot take over the raylet's
    socket), and every port its processes (driver, daemons, agents, a worker) listen on is on loopback.
    The watchdog it starts holds none of the cluster's secrets."""
    mine = os.path.join(shared_tmp, f"rlinf-ray-{os.geteuid()}")
    start = time.monotonic()
    proc = _driver(shared_tmp, RLINF_CLUSTER_SECRET="s" * 32)
    try:
        info = _first_line(proc, 100)
        assert "session" in info, info
        started = time.monotonic() - start
        session = info["session"]
        assert "raylet" in info["sockets"], info["sockets"]
        raylet = os.path.join(session, "sockets", "raylet")
        taken = _as_nobody(f"try:\n    os.rename({raylet!r}, {raylet + '.x'!r}); out['renamed'] = True\n"
                           "except OSError as exc:\n    out['errno'] = exc.errno")
        assert taken == {"errno": errno.EACCES}, f"uid nobody could take over the raylet's socket {raylet}: {taken}"
        assert session.startswith(mine + os.sep), f"Ray's session {session} is not in the private {mine}"
        assert info["watchdog_env"] and "PATH" in info["watchdog_env"], info["watchdog_env"]
        assert {"RAY_AUTH_TOKEN", "RLINF_CLUSTER_SECRET"}.isdisjoint(info["watchdog_env"]), info["watchdog_env"]
        st = os.lstat(mine)
        assert st.st_uid == os.geteuid() and (st.st_mode & 0o7777) == 0o700, oct(st.st_mode)

        names = {name for _, name, _, _ in info["listening"]}
        assert {"gcs_server", "raylet"} <= names, info["listening"]
        assert info["worker"] in {pid for pid, _, _, _ in info["listening"]}, "the worker's listeners were not seen"
        exposed = [entry for entry in info["listening"]
                   if entry[2] not in ("127.0.0.1", "::1", "::ffff:127.0.0.1")]
        assert not exposed, f"listening beyond loopback: {exposed}"
        proc.stdin.write("done\n")
        proc.stdin.flush()
        assert proc.wait(60) == 0, proc.communicate(timeout=30)[1][-3000:]
        # rlinf turns token auth on deliberately: Ray must not invite the user to turn it off
        assert "RAY_AUTH_MODE=disabled" not in proc.stderr.read()
        print(f"embedded cluster up with a worker in {started:.1f} s; {len(info['listening'])} listeners, all loopback")
    finally:
        _stop(proc)


def test_the_guards_tell_loopback_listeners_and_replaceable_directories(shared_tmp):
    """The checks behind the refusals, on real sockets and directories: a listener's address read from
    /proc, loopback told from the rest; a private directory in a parent others may write is refused."""
    from rlinf.ray import embedded

    with socket.socket() as s4, socket.socket(socket.AF_INET6) as s6:
        s4.bind(("127.0.0.1", 0))
        s6.bind(("::1", 0))
        for s in (s4, s6):
            s.listen()
        seen = {addr for _, _, addr in embedded.listeners([os.getpid()])}
        assert {f"127.0.0.1:{s4.getsockname()[1]}", f"::1:{s6.getsockname()[1]}"} <= seen, seen
    assert all(embedded.is_loopback(a) for a in ("127.0.0.1:80", "::1:80", "::ffff:127.0.0.1:80"))
    assert not any(embedded.is_loopback(a) for a in ("0.0.0.0:80", ":::80", "::ffff:192.0.2.2:80", "192.0.2.2:80"))

    open_parent = os.path.join(shared_tmp, "open")
    os.mkdir(open_parent)
    os.chmod(open_parent, 0o777)  # no sticky bit: anyone may rename what is inside
    with pytest.raises(PermissionError, match="sticky bit"):
        embedded.ray_temp_dir(open_parent)
    assert os.listdir(open_parent) == []


def test_a_base_through_another_users_link_is_refused_and_ours_is_resolved(shared_tmp):
    """``temp_dir=`` (or ``RLINF_RAY_TEMP_DIR``) naming another user's link to a root-owned sticky
    directory is refused (its owner could re-point it while Ray, which keeps the path, runs); a link
    of the user's own is resolved, so that re-pointing it later moves nothing."""
    from rlinf.ray import embedded

    sticky = tempfile.mkdtemp(prefix="rlt")
    os.chmod(sticky, 0o1777)  # root's, like /var/tmp
    try:
        theirs = os.path.join(shared_tmp, "base")
        _as_nobody(f"os.symlink({sticky!r}, {theirs!r})")
        with pytest.raises(PermissionError, match=f"{theirs} is a symbolic link .*uid {NOBODY}.*temp_dir="):
            embedded.ray_temp_dir(theirs)
        assert os.listdir(sticky) == []
        ours = os.path.join(shared_tmp, "ours")
        os.symlink(sticky, ours)
        path = embedded.ray_temp_dir(ours)
        assert path == os.path.join(os.path.realpath(sticky), f"rlinf-ray-{os.geteuid()}", "ray"), path
    finally:
        shutil.rmtree(sticky, ignore_errors=True)
