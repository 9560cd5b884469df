"""Who can keep ``python -m rlinf.scheduler status`` from working: a silent client, another user.

* The status listener of a worker lets a bounded number of connections wait
  to prove they hold its token, dropping the oldest, so silent connections
  cannot hold it (``security.HandshakeGate``, as for the cpu transport).
* The status directory (``rlinf.scheduler.tools.status_dir``) and any private
  directory made with ``security.private_dir`` are refused when another user
  made them first (or put a symbolic link there), with a message that says
  what to do; once that is done, status works.
"""

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from rlinf.scheduler import Worker
from rlinf.scheduler.base import security
from rlinf.scheduler.runtime import status_server

from launcher_marks import TEST_LAUNCHER

NOBODY = 65534
as_root = pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="becoming another user needs root")


class Quiet(Worker):
    def pid(self) -> int:
        return os.getpid()


def _silent(endpoint: dict) -> socket.socket:
    """A connection that never says a word (made without waiting: a listener that does not accept
    leaves it in the queue, which is what a silent client costs it)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.connect_ex((endpoint["host"], int(endpoint["port"])))
    return s


@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="the worker's process is watched with psutil on this host")
def test_silent_connections_do_not_hold_the_status_listener(launch):
    g = launch(Quiet, name="status_silent")
    endpoint = g._records[0].status
    pid = g.worker_info_list[0].pid
    worker = psutil.Process(pid)
    assert status_server.query(endpoint, 5)["pid"] == pid
    threads, fds = worker.num_threads(), worker.num_fds()
    silent = [_silent(endpoint) for _ in range(100)]
    try:
        time.sleep(1.0)  # the flood is in place
        took = []
        for _ in range(10):
            start = time.monotonic()
            assert status_server.query(endpoint, 5)["pid"] == pid
            took.append(time.monotonic() - start)
        # the status command gives a worker 2 s (status.WORKER_TIMEOUT); a query takes milliseconds
        assert max(took) < status_server.SERVE_TIMEOUT, took
        print(f"10 queries through 100 silent connections: max {max(took) * 1000:.1f} ms")
        assert worker.num_threads() <= threads + security.MAX_PENDING_HANDSHAKES + 8
        assert worker.num_fds() <= fds + security.MAX_PENDING_HANDSHAKES + 16
    finally:
        for s in silent:
            s.close()


# -- private directories ---------------------------------------------------------------------------
def _as_nobody(*command: str) -> None:
    subprocess.run(command, user=NOBODY, group=NOBODY, cwd="/", check=True, timeout=30)


@pytest.fixture
def shared():
    """A directory every user may write to, with the sticky bit (like /tmp), of this test's own."""
    path = tempfile.mkdtemp(prefix="rlt")
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_private_dir_is_made_0700_and_kept(shared):
    path = os.path.join(shared, "mine")
    assert security.private_dir(path) == path
    st = os.lstat(path)
    assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700)
    assert security.private_dir(path) == path  # there already, and right: taken as it is
    with pytest.raises(FileNotFoundError):
        security.private_dir(os.path.join(shared, "missing"), create=False)


def test_private_dir_refuses_a_mode_that_lets_others_in(shared):
    path = os.path.join(shared, "open")
    os.mkdir(path)
    os.chmod(path, 0o770)
    with pytest.raises(security.PrivateDirError, match=r"mode 0o?770.*chmod 700 " + path):
        security.private_dir(path)


@as_root
def test_private_dir_refuses_a_directory_another_user_made(shared):
    path = os.path.join(shared, "squatted")
    _as_nobody("mkdir", "-m", "700", path)
    with pytest.raises(security.PrivateDirError, match=f"owned by uid {NOBODY}.*remove it") as info:
        security.private_dir(path, hint="or set SOME_ENV to a directory of your own")
    assert "SOME_ENV" in str(info.value) and path in str(info.value)


@as_root
def test_private_dir_refuses_a_symbolic_link(shared):
    mine = tempfile.mkdtemp(prefix="rlt")  # private and ours: only the link is wrong
    try:
        path = os.path.join(shared, "link")
        _as_nobody("ln", "-s", mine, path)
        with pytest.raises(security.PrivateDirError, match=f"symbolic link.*{mine}.*remove it"):
            security.private_dir(path)
    finally:
        os.rmdir(mine)


# -- the status directory --------------------------------------------------------------------------
def _default_status_dir(monkeypatch, tmp: str) -> None:
    """This process takes ``<tmp>/rlinf-<uid>``, as a user who set neither RLINF_STATUS_DIR nor XDG_RUNTIME_DIR."""
    monkeypatch.delenv("RLINF_STATUS_DIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", tmp)
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again


def _status(env: dict, timeout=90) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlinf.scheduler", "status", "--json", "--timeout", "30"],
                          capture_output=True, text=True, env=env, timeout=timeout)


@as_root
@pytest.mark.skipif(TEST_LAUNCHER == "mpi", reason="runs the status command against the session's Ray cluster")
@pytest.mark.parametrize("squat", ["directory", "symlink"])
def test_a_status_directory_another_user_made_first_is_refused_with_the_fix(cluster, launch, shared, monkeypatch,
                                                                           caplog, squat):
    """Another user pre-creates ``<tmp>/rlinf-<uid>`` (the name is predictable) or puts a link there: the
    driver says so as it publishes, the status command refuses it naming the fix, and with the fix
    (``RLINF_STATUS_DIR``, or the squatter's directory removed) status finds the cluster."""
    from rlinf.ray import status as ray_status
    from rlinf.scheduler.tools import status_dir

    launch(Quiet, name="status_squatted")
    (ours,) = [body for _p, body, _m in status_dir.published(f"ray-{socket.gethostname()}-{os.getpid()}.json")]
    squatted = os.path.join(shared, f"rlinf-{os.getuid()}")
    elsewhere = tempfile.mkdtemp(prefix="rlt")  # a directory of ours the link points to
    if squat == "directory":
        _as_nobody("mkdir", "-m", "700", squatted)
    else:
        _as_nobody("ln", "-s", elsewhere, squatted)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RLINF_STATUS_DIR", "XDG_RUNTIME_DIR")}
    env["TMPDIR"] = shared
    published = status_dir.PublishedFile("ray")
    fixed = os.path.join(elsewhere, "status")
    try:
        _default_status_dir(monkeypatch, shared)
        with caplog.at_level(logging.WARNING, logger="rlinf.status"):
            assert published.write(ours) is False  # the driver runs on, and says why
        said = caplog.text
        assert squatted in said and "RLINF_STATUS_DIR" in said, said
        proc = _status(env)
        assert proc.returncode == 1, proc.stdout
        assert squatted in proc.stderr and "RLINF_STATUS_DIR" in proc.stderr, proc.stderr
        assert (f"owned by uid {NOBODY}" if squat == "directory" else "symbolic link") in proc.stderr, proc.stderr

        if squat == "directory":  # the fix the message names first: a directory of one's own
            monkeypatch.setenv("RLINF_STATUS_DIR", fixed)
            env["RLINF_STATUS_DIR"] = fixed
        else:  # or the squatter's entry removed (by its owner, or root)
            os.unlink(squatted)
        assert published.write(ours) is True
        proc = _status(env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        snap = json.loads(proc.stdout)
        assert "status_squatted" in {g["name"] for g in snap["groups"]}, snap
        assert ray_status._embedded() is not None
    finally:
        published.remove()
        shutil.rmtree(elsewhere, ignore_errors=True)


@as_root
def test_private_dir_refuses_a_parent_another_user_may_rename_it_in(shared):
    """The status directory's place too: a parent that another user owns, or that anyone may write to
    without the sticky bit, lets them rename a private directory away and put their own there."""
    theirs = os.path.join(shared, "theirs")
    _as_nobody("mkdir", "-m", "755", theirs)
    with pytest.raises(security.PrivateDirError, match=f"{theirs} .*uid {NOBODY}.*lets other users replace"):
        security.private_dir(os.path.join(theirs, "mine"))
    assert not os.path.exists(os.path.join(theirs, "mine"))  # refused before anything is made
    open_parent = os.path.join(shared, "open")
    os.mkdir(open_parent)
    os.chmod(open_parent, 0o777)
    with pytest.raises(security.PrivateDirError, match="sticky bit"):
        security.private_dir(os.path.join(open_parent, "mine"))
    os.chmod(open_parent, 0o1777)  # like /tmp: only a file's owner may rename it
    assert security.private_dir(os.path.join(open_parent, "mine"))


@as_root
def test_private_dir_refuses_another_users_link_among_its_parents_and_resolves_its_own(shared):
    """A base that is another user's link to a place that passes every check (a root-owned sticky
    directory) is refused: its owner could re-point it after the check, and the caller, still using
    the link, would write in the owner's tree.  A link of this user's (or root's) is resolved: the path
    returned leads through no link."""
    sticky = tempfile.mkdtemp(prefix="rlt")
    os.chmod(sticky, 0o1777)  # root's, like /var/tmp
    try:
        theirs = os.path.join(shared, "base")
        _as_nobody("ln", "-s", sticky, theirs)
        with pytest.raises(security.PrivateDirError, match=f"{theirs} is a symbolic link .*uid {NOBODY}.*rm {theirs}"):
            security.private_dir(os.path.join(theirs, "sub", "mine"), hint="or set SOME_ENV")
        assert os.listdir(sticky) == []  # refused before anything is made
        ours = os.path.join(shared, "ours")
        os.symlink(sticky, ours)
        got = security.private_dir(os.path.join(ours, "mine"))
        assert got == os.path.join(os.path.realpath(sticky), "mine") == os.path.realpath(got), got
        assert security.private_dir(got) == got
    finally:
        shutil.rmtree(sticky, ignore_errors=True)


@as_root
def test_private_dir_refuses_a_directory_on_the_way_that_another_user_may_rename(shared):
    """Not only the parent: a directory further up that another user owns lets them rename the parent
    (ours, 0700) away and put their own in its place."""
    theirs = os.path.join(shared, "theirs")
    _as_nobody("mkdir", "-m", "777", theirs)
    ours = os.path.join(theirs, "ours")
    os.mkdir(ours, 0o700)
    with pytest.raises(security.PrivateDirError, match=f"{theirs} .*uid {NOBODY}.*lets other users replace ours"):
        security.private_dir(os.path.join(ours, "mine"))
    assert os.listdir(ours) == []
