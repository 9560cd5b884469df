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
without the file.  The way to the directory is checked as ``security.private_dir``
checks its parents (``open_log_dir``): a symbolic link on it that another user
(not root) made is refused, and so is a directory above it that another user
owns or may write to without the sticky bit; the directory itself may be
anyone's.  Driver side, ``Cluster(distributed_log_dir=...)`` raises; a worker
says why on its terminal and runs on without the file.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import sys
from typing import Optional

from . import context
from .security import PrivateDirError, _check_parents, _resolve

LEVEL_ENV = "RLINF_LOG_LEVEL"
LOG_DIR_ENV = "RLINF_DISTRIBUTED_LOG_DIR"
ROOT = "rlinf"
WORKER_ROOT = "rlinf.worker"

_installed: list[logging.Handler] = []
#: set by a launcher that prefixes each line of a worker's output itself, naming the worker (Ray, whose
#: prefix names the group, rank, node and pid): the terminal's lines then carry that prefix alone
launcher_names_lines = False


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
    fd, log_dir = open_log_dir(os.path.abspath(os.fspath(log_dir)))  # refused before any group starts
    os.close(fd)
    os.environ[LOG_DIR_ENV] = log_dir  # forwarded to every worker launched from here (its links resolved)


_HINT = "or choose another distributed_log_dir"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_log_dir(path: str) -> tuple[int, str]:
    """``(descriptor, path)`` of the log directory ``path``, made as ``mkdir -p`` does, and the path it has.

    Symbolic links on the way that this user or root made are resolved first
    (the path returned has none); one that another user made is refused, as is a
    directory above ``path`` that another user owns or may write to without the
    sticky bit (``security.private_dir`` checks its parents so): its owner could
    put a link or a directory of theirs in place of the next one at any time.
    Then each directory is opened from ``/`` down without following a link,
    and checked on what was opened, so a link planted after the check is refused
    too.  ``path`` itself may be another user's (a shared log directory): its
    files are checked one by one (``open_log_file``).  Raises ``PermissionError``
    (``security.PrivateDirError``) naming the path, what is wrong and the fix;
    ``OSError`` when a directory cannot be made or opened.
    """
    real = _resolve(os.path.abspath(path), _HINT)
    _check_parents(real, _HINT)  # the clear message, before anything is made
    names = [name for name in real.split("/") if name]
    fd = os.open("/", _DIR_FLAGS)
    try:
        for depth, name in enumerate(names):
            here = "/" + "/".join(names[: depth + 1])
            try:
                os.mkdir(name, 0o777, dir_fd=fd)  # as os.makedirs: the umask decides
            except FileExistsError:
                pass
            try:
                fd, parent = os.open(name, _DIR_FLAGS, dir_fd=fd), fd
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise PrivateDirError(f"{here} is a symbolic link or not a directory, made since it was checked; "
                                      f"remove it (as its owner, or root), {_HINT}") from None
            os.close(parent)
            st = os.fstat(fd)
            if depth < len(names) - 1 and (st.st_uid not in (0, os.geteuid()) or
                                           st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
                raise PrivateDirError(f"{here} (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}) lets other "
                                      f"users replace {names[depth + 1]} in it (made since it was checked); {_HINT}")
        return fd, real
    except BaseException:
        os.close(fd)
        raise


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
    own = worker_logger(ctx.address.get_name()).name  # the worker's own logger: named by the prefix already
    formatter = _PrefixFormatter(prefix, own)
    stream = logging.StreamHandler(sys.stderr)
    if launcher_names_lines:
        stream.setFormatter(_PrefixFormatter("", own))
    _installed.append(stream)
    log_dir = ctx.env.get(LOG_DIR_ENV) or os.environ.get(LOG_DIR_ENV)
    if log_dir:
        try:
            _installed.append(_LogFileHandler(os.path.join(log_dir, f"{ctx.address.get_name()}.log")))
        except OSError as exc:  # the file is an aid: the worker runs on, logging to its terminal
            print(f"{prefix} not writing this worker's log file: {exc}", file=sys.stderr)
    try:
        level = log_level()
    except ValueError as exc:
        level = logging.INFO
        print(f"{prefix} {exc}; using INFO", file=sys.stderr)
    for handler in _installed:
        if handler.formatter is None:
            handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False  # the worker's own root logger config (if any) does not print it twice


def open_log_file(path: str, encoding: Optional[str] = "utf-8", errors: Optional[str] = None):
    """``path`` opened for appending text: created with mode 0600 if missing, never through a link.

    Its directory is made if missing and reached as ``open_log_dir`` says (no link
    of another user's on the way, nor a directory above it they may write to).
    The file is taken only when it is a regular file of this user with no other hard link: in a directory that
    other users may write to, a link or file planted under the predictable name would otherwise get
    this worker's lines wherever its maker chose (appended to a file of theirs, or of this user).
    ``encoding`` and ``errors`` are ``open``'s.  Raises ``PermissionError`` naming the path, what is
    wrong and what to do; ``OSError`` when it cannot be opened.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    dir_fd, real = open_log_dir(os.path.dirname(os.path.abspath(path)))
    name = os.path.basename(path)
    try:
        fd = os.open(name, flags, 0o600, dir_fd=dir_fd)  # O_NONBLOCK: a planted FIFO fails here instead of blocking
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO):
            os.close(dir_fd)
            raise
        st = os.lstat(name, dir_fd=dir_fd)
        problem = (f"is a symbolic link (to {os.readlink(name, dir_fd=dir_fd)})" if stat.S_ISLNK(st.st_mode)
                   else "is not a regular file")
        os.close(dir_fd)
    else:
        os.close(dir_fd)
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

    def __init__(self, prefix: str, own: str = ""):
        super().__init__("%(asctime)s %(levelname)s %(rlinf_origin)s%(message)s")
        self._prefix = f"{prefix} " if prefix else ""
        self._own = own

    def format(self, record: logging.LogRecord) -> str:
        record.rlinf_origin = "" if record.name == self._own else f"{record.name}: "  # other loggers: named
        return "\n".join(f"{self._prefix}{line}" for line in super().format(record).splitlines())


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
