"""The node-wide lock directory (``Worker.device_lock``, ``acquire_free_port``) when another user
(uid ``nobody``) made its default place first: refused, naming ``RLINF_LOCK_DIR``, which then works."""

import os
import shutil
import socket
import stat
import subprocess
import tempfile

import pytest

from rlinf.scheduler.base.security import PrivateDirError
from rlinf.scheduler.worker import lock

NOBODY = 65534
pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="becoming another user needs root")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def shared_tmp(monkeypatch):
    """A temporary directory like /tmp (anyone may make entries, only their maker may replace them)."""
    top = tempfile.mkdtemp(prefix="rlk")
    os.chmod(top, 0o1777)
    monkeypatch.setattr(tempfile, "tempdir", top)  # gettempdir() caches what it found first
    monkeypatch.delenv(lock.LOCK_DIR_ENV, raising=False)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def test_a_lock_dir_another_user_made_first_is_refused_and_rlinf_lock_dir_is_the_way_out(shared_tmp, monkeypatch):
    squatted = os.path.join(shared_tmp, f"{lock.LOCK_DIR_PREFIX}{os.geteuid()}")
    subprocess.run(["mkdir", "-m", "777", squatted], user=NOBODY, group=NOBODY, cwd="/", check=True, timeout=30)
    with pytest.raises(PrivateDirError, match=lock.LOCK_DIR_ENV):
        lock.lock_dir()
    with pytest.raises(PrivateDirError):
        lock.acquire_port(_free_port, 3)
    assert os.listdir(squatted) == []  # nothing was made in their directory
    mine = tempfile.mkdtemp(prefix="rlk")
    try:
        monkeypatch.setenv(lock.LOCK_DIR_ENV, os.path.join(mine, "locks"))
        assert lock.lock_dir() == os.path.join(mine, "locks")
        assert stat.S_IMODE(os.stat(lock.lock_dir()).st_mode) == 0o700
        port = lock.acquire_port(_free_port, 10)
        assert f"port-{port}.lock" in os.listdir(lock.lock_dir())
        assert os.listdir(squatted) == []
    finally:
        shutil.rmtree(mine, ignore_errors=True)
