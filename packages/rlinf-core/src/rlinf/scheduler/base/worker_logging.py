"""Worker logging: one prefixed stream per worker, INFO and above reaching the driver's terminal.

Each worker process logs through the ``rlinf`` logger hierarchy to its
stderr, which the launcher carries to the driver's terminal (Ray forwards
worker output to the driver, and prints the lines a worker wrote during a
group call before that call's results return; MPI ranks share ``mpiexec``'s
terminal).  Every
line starts with the worker's address and node, so lines of many workers stay
readable.  ``RLINF_LOG_LEVEL`` (``DEBUG``, ``INFO``, ...; default ``INFO``)
sets the level; with ``Cluster(distributed_log_dir=...)`` each worker also
writes its lines to ``<dir>/<address>.log``.  The directory reaches the
workers as ``RLINF_DISTRIBUTED_LOG_DIR``, like every ``RLINF_*`` setting of the
launching process.

The directory may be shared with other users, and the file names are easy to
guess: a log file is opened without following a symbolic link, made with mode
0600, and taken only when it is a regular file of this user with no other hard
link (``open_log_file``).  Another user's planted link or file is refused: the
worker says so on its terminal, naming the path and the fix, and runs on
without the file.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import sys
from typing import Optional

from . import context

LEVEL_ENV = "RLINF_LOG_LEVEL"
LOG_DIR_ENV = "RLINF_DISTRIBUTED_LOG_DIR"
ROOT = "rlinf"
WORKER_ROOT = "rlinf.worker"

_installed: list[logging.Handler] = []


def log_level() -> int:
    """The level ``RLINF_LOG_LEVEL`` names; a bad value is an error that says which values work."""
    raw = os.environ.get(LEVEL_ENV, "INFO").strip()
    if raw.isdigit():
        return int(raw)
    level = logging.getLevelName(raw.upper())
    if not isinstance(level, int):
        raise ValueError(f"{LEVEL_ENV}={raw!r} is not a log level (use DEBUG, INFO, WARNING, ERROR or CRITICAL)")
    return level


def take_cluster_options(options: dict) -> None:
    """Consume ``Cluster``'s logging keywords from ``options`` (``distributed_log_dir``)."""
    log_dir = options.pop("distributed_log_dir", None)
    if log_dir is None:
        return
    if not isinstance(log_dir, (str, os.PathLike)) or not str(log_dir):
        raise TypeError(f"distributed_log_dir must be a path, got {log_dir!r}")
    log_dir = os.path.abspath(os.fspath(log_dir))
    os.makedirs(log_dir, exist_ok=True)
    os.environ[LOG_DIR_ENV] = log_dir  # forwarded to every worker launched from here


def configure_worker_process() -> None:
    """Install this worker's handlers on the ``rlinf`` logger (again for each worker the process hosts)."""
    ctx = context.current()
    root = logging.getLogger(ROOT)
    for handler in _installed:
        root.removeHandler(handler)
        handler.close()
    _installed.clear()
    if ctx is None:
        return
    prefix = f"[{ctx.address.get_name()} node {ctx.info.node_id} {ctx.info.node_ip}]"
    formatter = _PrefixFormatter(prefix)
    stream = logging.StreamHandler(sys.stderr)
    _installed.append(stream)
    log_dir = ctx.env.get(LOG_DIR_ENV) or os.environ.get(LOG_DIR_ENV)
    if log_dir:
        try:
            os.makedirs(log_dir, exist_ok=True)
            _installed.append(_LogFileHandler(os.path.join(log_dir, f"{ctx.address.get_name()}.log")))
        except OSError as exc:  # the file is an aid: the worker runs on, logging to its terminal
            print(f"{prefix} not writing this worker's log file: {exc}", file=sys.stderr)
    try:
        level = log_level()
    except ValueError as exc:
        level = logging.INFO
        print(f"{prefix} {exc}; using INFO", file=sys.stderr)
    for handler in _installed:
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False  # the worker's own root logger config (if any) does not print it twice


def open_log_file(path: str, encoding: Optional[str] = "utf-8", errors: Optional[str] = None):
    """``path`` opened for appending text: created with mode 0600 if missing, never through a link.

    Taken only when it is a regular file of this user with no other hard link: in a directory that
    other users may write to, a link or file planted under the predictable name would otherwise get
    this worker's lines wherever its maker chose (appended to a file of theirs, or of this user).
    ``encoding`` and ``errors`` are ``open``'s.  Raises ``PermissionError`` naming the path, what is
    wrong and what to do; ``OSError`` when it cannot be opened.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)  # O_NONBLOCK: a planted FIFO fails here instead of blocking
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO):
            raise
        st = os.lstat(path)
        problem = (f"is a symbolic link (to {os.readlink(path)})" if stat.S_ISLNK(st.st_mode) else "is not a regular file")
    else:
        st = os.fstat(fd)
        problem = ("is not a regular file" if not stat.S_ISREG(st.st_mode) else
                   f"is owned by uid {st.st_uid}, not by you (uid {os.geteuid()})" if st.st_uid != os.geteuid() else
                   f"has {st.st_nlink} hard links" if st.st_nlink != 1 else None)
        if problem is None:
            os.set_blocking(fd, True)
            return os.fdopen(fd, "a", encoding=encoding, errors=errors)
        os.close(fd)
    raise PermissionError(
        f"log file {path} {problem} (owner uid {st.st_uid}): another user may have put it there to get "
        f"this worker's lines, so it is not written.  To fix: remove it (as its owner, or root: rm {path}), "
        f"or choose a distributed_log_dir that only you can write to")


class _LogFileHandler(logging.FileHandler):
    """A ``FileHandler`` whose file is opened by ``open_log_file`` (no links, this user's only)."""

    def __init__(self, path: str):
        super().__init__(path, encoding="utf-8")

    def _open(self):
        return open_log_file(self.baseFilename, self.encoding, self.errors)


class _PrefixFormatter(logging.Formatter):
    """Every line of a record (tracebacks, multi-line messages) starts with the worker's prefix."""

    def __init__(self, prefix: str):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._prefix = prefix

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(f"{self._prefix} {line}" for line in super().format(record).splitlines())


def worker_logger(address_name: Optional[str]) -> logging.Logger:
    return logging.getLogger(f"{WORKER_ROOT}.{address_name}" if address_name else WORKER_ROOT)


def report_call_failure(err) -> None:
    """One line per failed call, as it happens: seen in the driver even if nobody waits on the call."""
    text = str(err.args[0] if err.args else err)
    logging.getLogger(f"{WORKER_ROOT}.calls").error("%s", text.splitlines()[0] if text else type(err).__name__)


class LoggerAttribute:
    """``Worker.logger``: the class-wide ``rlinf.worker`` logger on the class, the worker's own on an instance."""

    def __get__(self, obj, cls=None) -> logging.Logger:
        if obj is None or "_logger" not in obj.__dict__:
            return logging.getLogger(WORKER_ROOT)
        return obj._logger
