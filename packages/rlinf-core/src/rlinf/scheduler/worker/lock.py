"""Node-wide locks of the workers: ``Worker.device_lock`` and the ports of ``Worker.acquire_free_port``.

RLinf keeps these locks in manager actors.  Here each is an ``flock`` on a
file in a private directory of the node, one per user
(``$TMPDIR/rlinf-locks-<uid>``, or ``RLINF_LOCK_DIR``; mode 0700, checked as
``base.security.private_dir`` checks: no other user can make, replace or enter
it, and one another user made first is refused with the way out):

* ``device-<id>.lock`` per accelerator, ``<id>`` being the node's own device
  id (what the worker's ``CUDA_VISIBLE_DEVICES`` lists): workers sharing an
  accelerator hold it one at a time, whatever their group.
* ``port-<n>.lock`` per port handed out: the worker that got the port holds
  the lock as long as it lives, so no other worker of the node gets that port.

The kernel drops an ``flock`` when its process ends, however it ends: a worker
killed while holding a device leaves it free for the next one, and its ports
become available again.  Every wait is bounded (``timeout``, default
``RLINF_TIMEOUT``); a device wait that runs out names the holder.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import socket
import tempfile
import threading
import time
from contextlib import AbstractContextManager
from typing import Iterable, Optional

from ..base import config, security

#: the per-user lock directory's name under the temporary directory
LOCK_DIR_PREFIX = "rlinf-locks-"
#: the lock directory to use instead (every process of the user on a node must see the same one; a launch
#: forwards it to its workers as it does every ``RLINF_*`` setting)
LOCK_DIR_ENV = "RLINF_LOCK_DIR"
_POLL_FIRST, _POLL_MOST = 0.002, 0.05


def lock_dir() -> str:
    """This user's lock directory on this node: ``RLINF_LOCK_DIR``, else ``$TMPDIR/rlinf-locks-<uid>``
    (made 0700 on first use; one another user made or can replace is refused, naming the way out)."""
    path = config.getenv(LOCK_DIR_ENV) or os.path.join(tempfile.gettempdir(), f"{LOCK_DIR_PREFIX}{os.geteuid()}")
    return security.private_dir(path, hint=f"set {LOCK_DIR_ENV} (or TMPDIR) to a directory of your own")


def _open(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"


def _record_holder(fd: int, who: str) -> None:
    """Write who holds the lock into its file, for the message of a worker that waits in vain; best effort:
    a full file system (another user may fill ``/tmp``) must not leave a lock taken and its holder raising."""
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, who.encode(), 0)
    except OSError:
        pass


def _unlock(fd: int) -> None:
    """Drop the flock, then the descriptor: a child forked while the lock was held shares the open file,
    and closing our descriptor alone would leave the lock held for as long as that child lives."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class DeviceLock(AbstractContextManager):
    """RLinf's ``DeviceLock``: the worker's accelerators, held by one worker of the node at a time.

    ``with self.device_lock:`` (or ``acquire()``/``release()``) around the code that uses the devices.
    A worker without accelerators locks nothing.  As in RLinf, acquiring a lock this worker holds returns
    at once (one ``release`` frees it), and releasing one it does not hold raises ``RuntimeError``.

    Args:
        worker: the worker (its name and place go into messages and the holder record).
        accelerator_ids: the node's device ids to lock (default: the worker's own, see
            ``WorkerUtilities.accelerator_ids``).
    """

    def __init__(self, worker, accelerator_ids: Optional[Iterable] = None):
        self._worker = worker
        self._given = None if accelerator_ids is None else sorted({str(i) for i in accelerator_ids})
        self._fds: list[int] = []
        self._state = threading.Lock()

    @property
    def accelerator_ids(self) -> list[str]:
        """The device ids this lock covers (sorted; empty: nothing to lock)."""
        if self._given is not None:
            return list(self._given)
        return sorted({str(i) for i in self._worker.accelerator_ids})

    @property
    def locked(self) -> bool:
        """Whether this worker holds the lock now."""
        return bool(self._fds)

    def acquire(self, timeout: Optional[float] = None) -> bool:
        """Wait until this worker holds every one of its devices (in id order, so two never deadlock).

        Args:
            timeout: seconds to wait at most (default ``RLINF_TIMEOUT``).

        Returns:
            True.

        Raises:
            TimeoutError: another worker held a device all that time (the message names it).
        """
        timeout = config.check_timeout(timeout)
        deadline = time.monotonic() + (config.default_timeout() if timeout is None else timeout)
        with self._state:
            if self._fds:
                return True
            ids = self.accelerator_ids
            if not ids:
                return True
            where = lock_dir()
            got: list[int] = []
            try:
                for dev in ids:
                    fd = _open(os.path.join(where, f"device-{_safe(dev)}.lock"))
                    pause = _POLL_FIRST
                    while not _try_flock(fd):
                        if time.monotonic() >= deadline:
                            holder = _holder(fd)
                            os.close(fd)
                            raise TimeoutError(
                                f"{self._describe()}: device lock of accelerator {dev} not acquired within "
                                f"{timeout if timeout is not None else config.default_timeout()} s; held by {holder}")
                        time.sleep(pause)
                        pause = min(pause * 2, _POLL_MOST)
                    got.append(fd)
                    _record_holder(fd, f"{self._describe()} pid {os.getpid()}")
            except BaseException:
                for fd in got:
                    _unlock(fd)
                raise
            self._fds = got
            return True

    def release(self) -> None:
        """Let the next worker have the devices.

        Raises:
            RuntimeError: this worker does not hold the lock (a worker without accelerators never does, and
                releasing is then a no-op).
        """
        with self._state:
            if not self.accelerator_ids:
                return
            if not self._fds:
                raise RuntimeError(f"{self._describe()}: Lock is not acquired.")
            fds, self._fds = self._fds, []
        for fd in fds:
            _unlock(fd)

    def _describe(self) -> str:
        worker = self._worker
        info = getattr(worker, "worker_info", None)
        node = f", node {info.node_id}" if info is not None else ""
        return f"worker {worker.worker_address.get_name()!r} (group {worker.worker_group_name!r}, rank {worker._rank}{node})"

    def __enter__(self):
        self.acquire()  # bounded: RLINF_TIMEOUT, then a TimeoutError naming the holder
        return self

    def __exit__(self, exc_type, exc_value, traceback):
        self.release()


#: descriptors of the port locks this process holds: kept open for the process's life (the port stays its own)
_port_fds: dict[int, int] = {}
_port_mutex = threading.Lock()


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
            return True
        except OSError:
            return False


def lock_port(port: int) -> bool:
    """Hand ``port`` to this process if no other live process of this user on the node has it (kept until exit).

    Returns:
        True if this process holds it now (also when it did already), False if another process does.
    """
    where = lock_dir()
    with _port_mutex:
        if port in _port_fds:
            return True
        fd = _open(os.path.join(where, f"port-{int(port)}.lock"))
        if not _try_flock(fd):
            os.close(fd)
            return False
        _port_fds[port] = fd
        _record_holder(fd, f"pid {os.getpid()}")
        return True


def _unlock_port(port: int) -> None:
    with _port_mutex:
        fd = _port_fds.pop(port, None)
    if fd is not None:
        _unlock(fd)


def acquire_port(find_port, max_tries: int) -> int:
    """A port free now that no other live process of this user on the node was handed (held until exit).

    Args:
        find_port: ``() -> int`` proposing a port (``Cluster.find_free_port``).
        max_tries: how many proposals to try.

    Raises:
        RuntimeError: none of them could be had.
    """
    for _ in range(max_tries):
        port = find_port()
        with _port_mutex:
            mine = port in _port_fds
        if mine or not lock_port(port):
            continue  # handed out already (to this process or another)
        if not _bindable(port):  # taken meanwhile by something that asked no lock
            _unlock_port(port)
            continue
        return port
    raise RuntimeError(f"Failed to acquire a free port after {max_tries} attempts.")


class PortLock:
    """RLinf's ``PortLock``: ports handed to one worker of the node (see ``lock_port``).

    Args:
        worker: the worker the ports are for.
    """

    def __init__(self, worker=None):
        self._worker = worker

    def acquire(self, port: int) -> bool:
        """Lock ``port`` for this worker.

        Args:
            port: the port.

        Returns:
            True if this worker holds it now, False if another worker of the node does.
        """
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"port must be an int in 1..65535, got {port!r}")
        return lock_port(port)
