"""Who can get a worker's log lines: ``Cluster(distributed_log_dir=...)`` in a directory another user
may write to, where the file names (``<address>.log``) are easy to guess.

Another user (uid ``nobody``) made the shared log directory and planted a link (or a file of theirs)
under a worker's log file name: the worker writes neither through the link nor into their file, says
why, and runs on (``worker_logging.open_log_file``).  A link they planted at the log directory itself
or at a directory on the way to it, or a directory of theirs that others may write to on the way, is
refused too: by ``Cluster(distributed_log_dir=...)`` before any group starts, and by a worker that
got the directory anyway (nothing is written where that user chose).
"""

import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid

import pytest

from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker
from rlinf.scheduler.base import worker_logging

NOBODY = 65534
pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="becoming another user needs root")


class Talker(Worker):
    def talk(self, line: str) -> int:
        self.log_warning(line)
        return self._rank


def _as_nobody(*command: str) -> None:
    subprocess.run(command, user=NOBODY, group=NOBODY, cwd="/", check=True, timeout=30)


@pytest.fixture
def shared_top():
    """A directory like /tmp: anyone may make entries in it, only their maker may replace them."""
    top = tempfile.mkdtemp(prefix="rlt")
    os.chmod(top, 0o1777)
    yield top
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def planted(shared_top):
    """``(log dir, victim file)``: a log directory uid nobody made (mode 0777, no sticky bit, so the
    kernel's protected_symlinks does not apply) and a file of this user's, in a directory of its own,
    that nobody would like the worker's lines appended to."""
    top = shared_top
    logs = os.path.join(top, "logs")
    _as_nobody("mkdir", "-m", "777", logs)
    private = tempfile.mkdtemp(prefix="rlt")
    victim = os.path.join(private, "victim.txt")
    with open(victim, "w") as f:
        f.write("mine\n")
    yield logs, victim
    shutil.rmtree(private, ignore_errors=True)


def test_a_planted_link_or_file_is_refused_with_the_fix(planted):
    logs, victim = planted
    link, theirs = os.path.join(logs, "g:0.log"), os.path.join(logs, "g:1.log")
    _as_nobody("ln", "-s", victim, link)
    _as_nobody("sh", "-c", f"touch {theirs} && chmod 666 {theirs}")
    for path, why in ((link, f"a symbolic link \\(to {re.escape(victim)}\\)"), (theirs, f"owned by uid {NOBODY}")):
        with pytest.raises(PermissionError, match=f"{re.escape(path)} is {why}.*rm {re.escape(path)}.*distributed_log_dir"):
            worker_logging.open_log_file(path)
    assert open(victim).read() == "mine\n" and os.path.getsize(theirs) == 0
    mine = os.path.join(logs, "g:2.log")
    with worker_logging.open_log_file(mine) as f:
        f.write("line\n")
    st = os.lstat(mine)
    assert (st.st_uid, st.st_mode & 0o777, open(mine).read()) == (os.geteuid(), 0o600, "line\n")


def test_a_worker_does_not_append_through_a_link_planted_in_the_log_dir(cluster, planted, monkeypatch):
    """The real path: a worker launched with the planted directory as its log dir."""
    logs, victim = planted
    name = f"planted_{uuid.uuid4().hex[:6]}"
    _as_nobody("ln", "-s", victim, os.path.join(logs, f"{name}:0.log"))
    monkeypatch.delenv("RLINF_DISTRIBUTED_LOG_DIR", raising=False)
    Cluster(distributed_log_dir=logs)  # the running cluster; the option applies to groups launched next
    try:
        g = Talker.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name=name)
    finally:
        os.environ.pop("RLINF_DISTRIBUTED_LOG_DIR", None)  # later tests' workers log to the terminal only
    try:
        assert g.talk("secret-line").wait(timeout=60) == [0, 1]  # refused file, but the worker runs
        ours = os.path.join(logs, f"{name}:1.log")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "secret-line" not in (open(ours).read() if os.path.exists(ours) else ""):
            time.sleep(0.1)
        assert "secret-line" in open(ours).read()  # the other worker's file is written, so a line had time to land
        assert open(victim).read() == "mine\n", "the worker appended its lines through another user's link"
    finally:
        g.stop()


@pytest.fixture
def theirs(shared_top):
    """``(top, where)``: the shared top directory and a directory uid nobody made in it (mode 0777),
    where nobody would like the workers' log files to go."""
    where = os.path.join(shared_top, "theirs")
    _as_nobody("mkdir", "-m", "777", where)
    return shared_top, where


def _plant(top: str, where: str, how: str) -> str:
    """The log directory a user names, with nobody's trap on the way: a link at the directory itself, a
    link at a parent, or a parent that nobody owns and lets anyone write to (no sticky bit)."""
    if how == "link at the directory":
        _as_nobody("ln", "-s", where, os.path.join(top, "logs"))
        return os.path.join(top, "logs")
    if how == "link at a parent":
        _as_nobody("ln", "-s", where, os.path.join(top, "runs"))
        return os.path.join(top, "runs", "logs")
    return os.path.join(where, "logs")  # "writable parent": nobody may swap logs/ for a link or a dir of theirs


TRAPS = ["link at the directory", "link at a parent", "writable parent"]


@pytest.mark.parametrize("how", TRAPS)
def test_the_driver_refuses_a_log_dir_another_user_can_redirect(theirs, monkeypatch, how):
    top, where = theirs
    log_dir = _plant(top, where, how)
    monkeypatch.delenv(worker_logging.LOG_DIR_ENV, raising=False)
    trap = {"link at the directory": log_dir, "link at a parent": os.path.dirname(log_dir)}.get(how, where)
    with pytest.raises(PermissionError, match=f"{re.escape(trap)} .*(symbolic link|other users).*distributed_log_dir"):
        worker_logging.take_cluster_options({"distributed_log_dir": log_dir})
    assert worker_logging.LOG_DIR_ENV not in os.environ
    with pytest.raises(PermissionError, match=re.escape(trap)):  # a worker given the directory all the same
        worker_logging.open_log_file(os.path.join(log_dir, "g:0.log"))
    assert os.listdir(where) == [], "a log directory or file was made where another user chose"


def test_a_worker_given_a_redirected_log_dir_writes_nothing_there_and_runs_on(cluster, theirs, monkeypatch):
    """The real path: workers launched with a log dir whose parent is another user's link (as a worker on
    another node, or one launched with ``RLINF_DISTRIBUTED_LOG_DIR`` set, gets it unchecked by the driver)."""
    top, where = theirs
    monkeypatch.setenv(worker_logging.LOG_DIR_ENV, _plant(top, where, "link at a parent"))
    try:
        g = Talker.create_group().launch(cluster, NodePlacementStrategy([0]), name=f"redirected_{uuid.uuid4().hex[:6]}")
    finally:
        monkeypatch.delenv(worker_logging.LOG_DIR_ENV)  # later tests' workers log to the terminal only
    try:
        assert g.talk("secret-line").wait(timeout=60) == [0]  # no log file, but the worker runs
        assert os.listdir(where) == [], "the worker wrote its log where another user chose"
    finally:
        g.stop()
