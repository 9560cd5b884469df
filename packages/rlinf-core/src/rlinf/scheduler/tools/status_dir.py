"""Where a job on this machine publishes what ``python -m rlinf.scheduler status`` needs.

A per-user directory: ``$RLINF_STATUS_DIR``, else ``$XDG_RUNTIME_DIR/rlinf``
when that runtime directory is this user's (one inherited through ``su`` or
``sudo`` is another user's and passed over), else ``<tmp>/rlinf-<uid>``.  It
is made with mode 0700 and checked before each use (``security.private_dir``:
this user's, no group or other bits, not a symbolic link), so that the tokens
in its files (mode 0600) stay the user's.  The name in ``<tmp>`` is easy to
guess: another user may make it first, or put a link there.  Such a directory
is refused, never used; the driver says so in a warning (its job runs on, not
listed by status) and the status command in its error, both naming the fix:
``RLINF_STATUS_DIR`` for a directory of one's own, or the squatter's entry
removed.  A file names the process that wrote it (``process_mark``),
so that a reader can tell whether it still runs (``runs_here``) even after
its pid went to another process, and a writer can remove the files of
processes killed before they removed their own (``remove_leftovers``).
"""

from __future__ import annotations

import atexit
import glob
import json
import logging
import os
import socket
import stat
import tempfile
import time
from typing import Optional

from ..base import jsonfile, security
from ..base.processes import process_running

STATUS_DIR_ENV = "RLINF_STATUS_DIR"
_log = logging.getLogger("rlinf.status")


def _runtime_dir() -> Optional[str]:
    """``$XDG_RUNTIME_DIR`` if it is a directory of this user that only this user can use, else None."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if not runtime:
        return None
    try:
        st = os.stat(runtime)
    except OSError:
        return None
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077:
        return runtime
    return None


def status_dir() -> str:
    explicit = os.environ.get(STATUS_DIR_ENV)
    if explicit:
        return explicit
    runtime = _runtime_dir()
    if runtime:
        return os.path.join(runtime, "rlinf")
    return os.path.join(tempfile.gettempdir(), f"rlinf-{os.getuid()}")


def private_status_dir(create: bool) -> str:
    """The directory, checked (and made when ``create``); raises ``security.PrivateDirError`` (a
    ``PermissionError`` that names the fix) if it is not this user's alone, ``FileNotFoundError``
    if it is missing and not ``create``."""
    where = "another" if os.environ.get(STATUS_DIR_ENV) else "a"
    hint = (f"or set {STATUS_DIR_ENV} to {where} directory of your own for the status files (made with mode "
            f"0700 if missing; the same for the jobs and the status command), e.g. "
            f"export {STATUS_DIR_ENV}=$HOME/.rlinf-status")
    return security.private_dir(status_dir(), create=create, hint=hint)


def publish(name: str, body: dict, prefix: str) -> str:
    """Write ``body`` as JSON to file ``name`` of the private directory (made if needed): atomically (a
    reader never sees half a file), mode 0600.  The first time, the files ``<prefix>-<host>-*.json`` of
    processes of this host that are gone are removed.  Raises ``OSError``."""
    directory = private_status_dir(create=True)
    path = os.path.join(directory, name)
    if not os.path.exists(path):
        remove_leftovers(directory, prefix)
    return jsonfile.replace(path, body, f".{prefix}-", ".tmp")  # mode 0600


class PublishedFile:
    """This process's ``<prefix>-<host>-<pid>.json`` in the private directory: rewritten by ``write``,
    removed by ``remove`` or at exit.  Best effort: status is an aid, and a read-only or foreign
    directory must not break the job that publishes."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.path: Optional[str] = None
        self._at_exit = False
        self._warned = False

    def write(self, body: dict) -> bool:
        try:
            self.path = publish(f"{self.prefix}-{socket.gethostname()}-{os.getpid()}.json", body, self.prefix)
        except OSError as exc:
            if not self._warned:  # once: the job runs on, but the user should know why status misses it
                self._warned = True
                _log.warning("python -m rlinf.scheduler status will not list this job: %s", exc)
            return False
        self._warned = False  # working again: a later failure is said again
        if not self._at_exit:
            atexit.register(self.remove)
            self._at_exit = True
        return True

    def remove(self) -> None:
        path, self.path = self.path, None
        if path is not None:
            try:
                os.unlink(path)
            except OSError:
                pass


def _read_all(directory: str, pattern: str) -> list:
    """``(path, body, mtime)`` of the files of ``directory`` matching ``pattern`` (a glob), by name;
    files that cannot be read, are half written or hold no JSON object are skipped."""
    found = []
    for path in sorted(glob.glob(os.path.join(directory, pattern))):
        try:
            with open(path) as f:
                body = json.load(f)
                mtime = os.fstat(f.fileno()).st_mtime
        except (OSError, ValueError):
            continue
        if isinstance(body, dict):
            found.append((path, body, mtime))
    return found


def published(pattern: str) -> Optional[list]:
    """What jobs published in the private directory: ``(path, body, mtime)`` of the files matching
    ``pattern``; None when there is no directory.  A directory that is not private raises
    ``RuntimeError``: its files could be anyone's."""
    try:
        directory = private_status_dir(create=False)
    except FileNotFoundError:
        return None
    except PermissionError as exc:
        raise RuntimeError(str(exc)) from None
    return _read_all(directory, pattern)


# -- whether the process that wrote a file still runs -------------------------------------------------
def _started(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot, ``/proc``); None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _boot() -> Optional[str]:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def process_mark() -> dict:
    """What names this process for ``runs_here`` in a file it publishes: pid, host, boot and start time
    (a pid alone is handed to another process once this one ends, and a killed job leaves its file)."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "boot": _boot(), "started": _started(pid)}


def runs_here(mark: dict) -> bool:
    """Whether the process of ``mark`` (``process_mark``, written on this host) still runs."""
    try:
        pid = int(mark.get("pid", 0))
    except (TypeError, ValueError):
        return False
    if pid <= 0 or mark.get("boot") not in (None, _boot()):
        return False  # written before this machine booted
    if not process_running(pid):
        return False
    started = mark.get("started")
    return started is None or _started(pid) in (None, started)


#: seconds after which a half-written ``.<prefix>-*.tmp`` file is a leftover of a process killed mid-write
_TMP_LEFTOVER_AGE = 600.0


def remove_leftovers(directory: str, prefix: str) -> None:
    """Remove this host's ``<prefix>-<host>-*.json`` files whose process is gone (killed, say), and
    half-written files of ``publish`` older than ten minutes."""
    host = socket.gethostname()
    for path in glob.glob(os.path.join(directory, f".{prefix}-*.tmp")):
        try:
            if time.time() - os.stat(path).st_mtime > _TMP_LEFTOVER_AGE:
                os.unlink(path)
        except OSError:
            continue
    for path, body, _mtime in _read_all(directory, f"{prefix}-{host}-*.json"):
        if body.get("host") == host and body.get("pid") != os.getpid() and not runs_here(body):
            try:
                os.unlink(path)
            except OSError:
                continue
