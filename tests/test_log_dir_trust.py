"""Who can get a worker's log lines: ``Cluster(distributed_log_dir=...)`` in a directory another user
may write to, where the file names (``<address>.log``) are easy to guess.

Another user (uid ``nobody``) made the shared log directory and planted a link (or a file of theirs)
under a worker's log file name: the worker writes neither through the link nor into their file, says
why, and runs on (``worker_logging.open_log_file``).
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
def planted():
    """``(log dir, victim file)``: a log directory uid nobody made (mode 0777, no sticky bit, so the
    kernel's protected_symlinks does not apply) and a file of this user's, in a directory of its own,
    that nobody would like the worker's lines appended to."""
    top = tempfile.mkdtemp(prefix="rlt")
    os.chmod(top, 0o1777)  # like /tmp
    logs = os.path.join(top, "logs")
    _as_nobody("mkdir", "-m", "777", logs)
    private = tempfile.mkdtemp(prefix="rlt")
    victim = os.path.join(private, "victim.txt")
    with open(victim, "w") as f:
        f.write("mine\n")
    yield logs, victim
    shutil.rmtree(top, ignore_errors=True)
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
