"""Worker output in order with the driver's: the lines of a call are printed before its results return.

Ray carries a worker's stdout and stderr to the driver through its log
monitor, which tails the worker's log files and publishes what it reads; the
driver's ``ray_print_logs`` thread prints it, 100 to 500 ms after the worker
wrote it.  Without help, a driver line printed right after ``wait()`` comes
before the lines the workers wrote during the call.

Worker side (``after_call``, run by every forwarder of the actor): at the end
of a call, flush ``sys.stdout``/``sys.stderr`` and compare the positions of
file descriptors 1 and 2 (Ray points them at regular files) with where the
last mark ended.  A silent call costs two ``lseek``; a call that wrote
something appends one mark line (``:rlinf_log_mark: <token> <seq>``) to each
stream it wrote to and returns its result wrapped in ``Marked``.

Driver side (``install``, ``strip``, ``wait``): Ray's print handler is
replaced by ``_Printer``, which drops the mark lines, remembers the highest
mark seen per worker stream, and prints the other lines as Ray does (same
prefix, same deduplication), without escape codes when the stream is not a
terminal.  Collecting a call's results, the launcher strips the wrappers and
waits, at most ``RLINF_LOG_SYNC_TIMEOUT`` seconds (default 2; 0: never), until
the marks of every worker that wrote are seen, then prints what Ray's
deduplication held back (``[repeated Nx across cluster]``).  Nothing waits
where Ray does not forward the workers' output to this process
(``log_to_driver=False``, a worker process, a worker of another job), and
a worker that died returns nothing to wait for.

Ray's print handler is private API: where it is not found as expected the
lines are left to Ray as they are (one debug log line says so).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
import secrets
import sys
import threading
import time
from typing import Any, NamedTuple, Optional

#: seconds a collect waits at most for the lines its calls wrote (0: never waits, workers write no marks)
SYNC_TIMEOUT_ENV = "RLINF_LOG_SYNC_TIMEOUT"
DEFAULT_SYNC_TIMEOUT = 2.0
MARK = ":rlinf_log_mark:"
#: Ray's print handler on the driver's log dispatcher
RAY_HANDLER = "ray_print_logs"
_POLL = 0.005
_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

logger = logging.getLogger("rlinf.ray.logs")


class Marked(NamedTuple):
    """On the wire: a call's result (``wire``) from a worker that wrote output during the call.

    ``out``/``err``: the mark that follows the call's lines on stdout/stderr (0: nothing written there);
    ``token``: the worker process's mark token; ``job``: its Ray job id (hex)."""

    wire: Any
    token: str
    job: str
    out: int
    err: int


def sync_timeout() -> float:
    """Seconds ``RLINF_LOG_SYNC_TIMEOUT`` allows (default 2; 0 or less: no waiting).

    Raises:
        ValueError: the variable is not a finite number.
    """
    raw = os.environ.get(SYNC_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_SYNC_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"environment variable {SYNC_TIMEOUT_ENV}={raw!r} must be a finite number of seconds")
    return max(0.0, value)


# -- worker side ------------------------------------------------------------------------------------


class _Streams:
    """This worker process's marks: positions of fds 1 and 2 where the last mark ended, and its counter."""

    def __init__(self):
        self.lock = threading.Lock()
        self.token = secrets.token_hex(6)
        self.job: Optional[str] = None
        self.seq = 0
        self.pos = [-1, -1]  # fd 1, fd 2; -1: not known yet (the next call takes a baseline)
        self.mark = [0, 0]  # seq of the last mark written to fd 1, fd 2
        self.off = False


_streams = _Streams()


def _positions() -> tuple:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass  # closed, None or a replacement without flush: what reached the fd is what counts
    return os.lseek(1, 0, os.SEEK_CUR), os.lseek(2, 0, os.SEEK_CUR)


def baseline() -> None:
    """Take the current positions of stdout and stderr as "nothing written yet" (the actor's start).

    Where fds 1 and 2 are not regular files (a terminal, a pipe), this process writes no marks.  Never raises."""
    st = _streams
    try:
        pos = _positions()
    except OSError:  # not regular files (a terminal, a pipe): no marks in this process
        st.off = True
        return
    with st.lock:
        st.pos = list(pos)


def name_worker(name: str) -> None:
    """In a worker process: have Ray's prefix of this process's lines say ``name`` (``(rollout:0 node 0
    pid=...)``) instead of the actor's class (``Rlinf_Rollout``): Ray's log monitor takes a line
    ``:actor_name:<name>`` on each stream as the name for the lines after it, and prints it not.

    Args:
        name: the worker's group, rank and node.
    """
    try:
        from ray._private.ray_constants import LOG_PREFIX_ACTOR_NAME
    except ImportError:
        return
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.write(f"{LOG_PREFIX_ACTOR_NAME}{name}\n")
            stream.flush()
        except (OSError, ValueError):
            pass


def after_call(wire):
    """``wire``, or ``Marked(wire, ...)`` when this process wrote to stdout or stderr since the last mark.

    Run by the actor at the end of each call; a silent call costs two flushes and two ``lseek``.

    Args:
        wire: the call's outcome in wire form (``launcher.to_wire``), returned as it is or wrapped.

    Never raises: where a mark cannot be written (a full disk), this process writes no more marks.
    """
    st = _streams
    if st.off:
        return wire
    try:
        pos = _positions()
    except OSError:
        st.off = True
        return wire
    if pos[0] == st.pos[0] and pos[1] == st.pos[1]:
        return wire
    try:
        return _mark(wire, pos)
    except OSError:
        st.off = True
        return wire


def _mark(wire, seen: tuple):
    st = _streams
    try:
        if sync_timeout() <= 0:
            st.off = True
            return wire
    except ValueError:
        pass  # the driver says so, where the value is read for waiting
    need = [0, 0]
    with st.lock:
        if st.pos[0] < 0:  # first call without a baseline: what came before is not this call's
            st.pos = list(seen)
            return wire
        if st.job is None:
            st.job = _job_id()
        for i, fd in enumerate((1, 2)):
            if seen[i] == st.pos[i]:
                continue  # not written to during this call
            now = os.lseek(fd, 0, os.SEEK_CUR)
            if now != st.pos[i]:  # else another call's mark, written meanwhile, follows these lines
                st.seq += 1
                os.write(fd, f"{MARK}{st.token} {st.seq}\n".encode())
                st.mark[i] = st.seq
                st.pos[i] = os.lseek(fd, 0, os.SEEK_CUR)
            need[i] = st.mark[i]
    return Marked(wire, st.token, st.job, need[0], need[1])


def _job_id() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_job_id() or ""
    except Exception:
        return ""


# -- driver side -------------------------------------------------------------------------------------


class _Printer:
    """Ray's print handler without the mark lines; records the marks it saw, per worker stream."""

    def __init__(self, original, job: str):
        self.original = original
        self.job = job
        self.seen: dict = {}  # (token, is_err) -> highest mark seq seen
        self.cond = threading.Condition()
        self.print_lock = threading.Lock()
        self.ray_print = _ray_print_parts(original)

    def __call__(self, data) -> None:
        lines = data.get("lines") or ()
        marks = None
        if any(MARK in line for line in lines):
            kept, marks = [], []
            for line in lines:
                at = line.find(MARK)
                if at < 0:
                    kept.append(line)
                    continue
                if at > 0:  # the call's last line had no newline: the mark went on after it
                    kept.append(line[:at])
                token, _, seq = line[at + len(MARK):].partition(" ")
                marks.append((token, int(seq) if seq.isdigit() else 0))
            data = dict(data, lines=kept)
        if marks is None or data["lines"]:
            with self.print_lock:
                self._print(data)
        if marks:
            is_err = bool(data.get("is_err"))
            with self.cond:
                for token, seq in marks:
                    key = (token, is_err)
                    if seq > self.seen.get(key, 0):
                        self.seen[key] = seq
                self.cond.notify_all()

    def _print(self, data) -> None:
        if self.ray_print is None:
            self.original(data)
            return
        worker, ignore_prefix = self.ray_print
        sink = sys.stderr if data["is_err"] else sys.stdout
        if data.get("pid") in ["autoscaler"]:  # as Ray's print_to_stdstream
            batches = [data]
        else:
            dedup = worker.stderr_deduplicator if data["is_err"] else worker.stdout_deduplicator
            batches = dedup.deduplicate(data)
        # past the first, batches are Ray's "[repeated Nx across cluster]" lines, which it colours
        for i, batch in enumerate(batches):
            worker.print_worker_logs(batch if i == 0 else _plain_batch(batch, sink), sink, ignore_prefix)

    def flush_repeats(self) -> None:
        """Print the lines Ray's deduplication holds back (aggregated), as Ray does at disconnect."""
        if self.ray_print is None:
            return
        worker, ignore_prefix = self.ray_print
        with self.print_lock:
            for dedup, sink in ((worker.stdout_deduplicator, sys.stdout), (worker.stderr_deduplicator, sys.stderr)):
                if dedup.recent:
                    for batch in dedup.flush():
                        worker.print_worker_logs(_plain_batch(batch, sink), sink, ignore_prefix)

    def missing(self, need: dict) -> bool:
        seen = self.seen
        return any(seen.get(key, 0) < seq for key, seq in need.items())


def _ray_print_parts(original):
    """``(ray._private.worker, ignore_prefix)`` when ``original`` is Ray's ``print_to_stdstream`` with the
    deduplicators and printer this module uses; else None (the original is called as it is)."""
    try:
        from ray._private import worker
    except ImportError:
        return None
    ray_print = getattr(worker, "print_to_stdstream", None)
    ray_print = getattr(ray_print, "__wrapped__", ray_print)  # ``_quiet_worker_deaths``' wrapper
    if not (isinstance(original, functools.partial) and original.func is ray_print):
        return None
    if not all(hasattr(worker, n) for n in ("stdout_deduplicator", "stderr_deduplicator", "print_worker_logs")):
        return None
    if not all(hasattr(d, "recent") for d in (worker.stdout_deduplicator, worker.stderr_deduplicator)):
        return None
    return worker, bool(original.keywords.get("ignore_prefix", False))


def _plain_batch(batch: dict, sink) -> dict:
    """``batch`` without terminal escape codes in its lines, unless ``sink`` is a terminal."""
    if is_tty(sink):
        return batch
    return dict(batch, lines=[plain(line) for line in batch.get("lines", ())])


def is_tty(stream) -> bool:
    """Whether ``stream`` is a terminal; never raises.

    Args:
        stream: a file object (None, a closed stream or one without ``isatty`` is not a terminal).
    """
    try:
        return bool(stream.isatty())
    except Exception:
        return False


def plain(text: str) -> str:
    """``text`` without terminal escape sequences (colours).

    Args:
        text: any string.
    """
    return _ESCAPE.sub("", text) if "\x1b" in text else text


_CARETS = re.compile(r"^\s*[\^~]+[\s\^~]*$")


def plain_traceback(text: str) -> str:
    """A remote traceback as Ray gives it, made readable: no terminal escape sequences, and none of the
    position markers (``^^^^``) left on lines of their own where Ray dropped the source line they mark.

    Args:
        text: a traceback.
    """
    lines = plain(text).splitlines()
    kept = []
    for i, line in enumerate(lines):
        if _CARETS.match(line):
            marks_code = i >= 2 and lines[i - 2].startswith("  File ") and lines[i - 1].startswith("    ")
            if not marks_code:
                continue
        kept.append(line)
    return "\n".join(kept)


_printer: Optional[_Printer] = None


#: how the raylet's report of a worker process that died begins (with lease, worker and node ids): rlinf
#: reports the death itself, naming group, rank, node, method and how the process ended
_RAYLET_DEATH = "A worker died or was killed while executing a task"


def _quiet_worker_deaths(worker) -> None:
    """Leave out the raylet's reports of dead worker processes, which Ray prints to the driver's terminal
    (``print_to_stdstream`` with pid "raylet") besides the error rlinf raises and its warning."""
    ray_print = getattr(worker, "print_to_stdstream", None)
    if ray_print is None or hasattr(ray_print, "__wrapped__"):
        return

    def print_to_stdstream(data, *args, **kwargs):
        if data.get("pid") == "raylet" and any(_RAYLET_DEATH in line for line in data.get("lines") or ()):
            data = dict(data, lines=[line for line in data["lines"] if _RAYLET_DEATH not in line])
            if not data["lines"]:
                return None
        return ray_print(data, *args, **kwargs)

    print_to_stdstream.__wrapped__ = ray_print
    worker.print_to_stdstream = print_to_stdstream


def install() -> None:
    """In a driver that takes its workers' output: put ``_Printer`` in place of Ray's print handler.

    Idempotent; done again after Ray is initialised anew.  In a worker process, with
    ``log_to_driver=False`` or where Ray's handler is not where this module expects it, nothing changes.

    Raises:
        ValueError: ``RLINF_LOG_SYNC_TIMEOUT`` is not a number.
    """
    global _printer
    sync_timeout()
    try:
        import ray
        from ray._private import worker
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError as exc:
        logger.debug("worker lines are printed as Ray prints them: %s", exc)
        return
    try:
        if worker.global_worker.mode != ray.SCRIPT_MODE:
            return  # a worker process: Ray forwards nothing to it
        _quiet_worker_deaths(worker)
        with dispatcher._lock:
            handlers = list(dispatcher.handlers)
            for i, (name, handler) in enumerate(handlers):
                if name != RAY_HANDLER:
                    continue
                if isinstance(handler, _Printer):
                    _printer = handler
                    return
                _printer = _Printer(handler, ray.get_runtime_context().get_job_id() or "")
                handlers[i] = (name, _printer)
                dispatcher.handlers = handlers
                return
    except Exception as exc:  # another Ray's internals: its own printing stays
        logger.debug("worker lines are printed as Ray prints them: %s: %s", type(exc).__name__, exc)


def _active() -> Optional[_Printer]:
    """The installed printer while Ray still calls it (Ray drops its handler at shutdown)."""
    printer = _printer
    if printer is None:
        return None
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

        if any(handler is printer for _, handler in dispatcher.handlers):
            return printer
    except Exception:
        pass
    return None


def strip(value, needs: list):
    """The wire value inside ``value`` (a call's result as Ray returned it).

    Args:
        value: ``Marked`` or a bare wire value.
        needs: list that collects the marks to wait for (``wait``); a ``Marked`` value's is appended.
    """
    if type(value) is Marked:
        needs.append(value)
        return value.wire
    return value


def strip_all(values: list, needs: list) -> list:
    """``strip`` of each value (the list itself when none is marked: the common, silent case).

    Args:
        values: the calls' results as Ray returned them.
        needs: list that collects the marks to wait for.
    """
    if not any(type(v) is Marked for v in values):
        return values
    return [strip(v, needs) for v in values]


def _plan(needs: list):
    """``(printer, {(token, is_err): seq}, deadline)`` to wait for, or None when there is nothing to wait for."""
    if not needs:
        return None
    printer = _active()
    if printer is None:
        return None
    try:
        timeout = sync_timeout()
    except ValueError:
        timeout = DEFAULT_SYNC_TIMEOUT
    if timeout <= 0:
        return None
    need: dict = {}
    for m in needs:
        if m.job != printer.job:
            continue  # another job's worker: Ray forwards its lines to that job's driver
        for is_err, seq in ((False, m.out), (True, m.err)):
            if seq:
                key = (m.token, is_err)
                need[key] = max(need.get(key, 0), seq)
    if not need:
        return None
    return printer, need, time.monotonic() + timeout


def wait(needs: list) -> None:
    """Block until the lines before the marks in ``needs`` are printed, then print what Ray's deduplication holds.

    Waits at most ``RLINF_LOG_SYNC_TIMEOUT`` seconds, and not at all where this process does not print its
    workers' lines or for marks of another job's workers.  Never raises.

    Args:
        needs: the ``Marked`` results collected by ``strip``.
    """
    plan = _plan(needs)
    if plan is None:
        return
    printer, need, deadline = plan
    with printer.cond:
        while printer.missing(need):
            left = deadline - time.monotonic()
            if left <= 0:
                logger.debug("worker lines still on their way after %.1f s; not waiting longer", sync_timeout())
                break
            printer.cond.wait(left)
    printer.flush_repeats()


async def wait_async(needs: list) -> None:
    """``wait`` on the event loop (polls every few milliseconds, never blocks the loop); never raises.

    Args:
        needs: the ``Marked`` results collected by ``strip``.
    """
    plan = _plan(needs)
    if plan is None:
        return
    printer, need, deadline = plan
    while printer.missing(need) and time.monotonic() < deadline:
        await asyncio.sleep(_POLL)
    printer.flush_repeats()


__all__ = ["Marked", "after_call", "baseline", "install", "is_tty", "plain", "strip", "strip_all", "sync_timeout",
           "wait", "wait_async"]
