"""The timeline: one Chrome trace / Perfetto JSON file of a whole run.

``RLINF_TRACE=path.json`` (written when the driver exits) or
``with cluster.trace("path.json"):`` (written when the block ends; also
``cluster.dump_trace(path)`` at any moment) records, in the driver and every
worker: group calls (submit, the run on each rank, the result), ``worker_timer``
spans, point-to-point operations (peer, bytes, transport, duration) and
channel operations (key, wait time).  See ``docs/tracing.md``.

Off, it costs nothing: the hook points (``hooks.hook``) are the plain
functions until tracing is switched on in a process.  Modules: ``hooks`` (the
marks and the swap), ``recorder`` (the per-process buffer and clock),
``wrappers`` (what records), ``collect`` (control calls, clock offsets,
bounded gathering), ``export`` (the JSON file).

Layer: above ``messaging`` (its wrappers instrument it; its collector reaches
workers through launcher sessions), below ``runtime``, which starts it and
registers its groups (``collect.group_source``, ``provide_runtime``).  It may
import ``messaging``, ``transports``, ``plugins`` and ``base``.
"""

from __future__ import annotations

import os
import sys

from . import collect, export, jsonl, recorder, spans, wrappers  # wrappers: registers what ``recorder.enable`` installs

#: the file the driver writes at exit; set, it also makes every worker record from its start
TRACE_ENV = "RLINF_TRACE"

_exit_registered = False
_exit_path = None  # the RLINF_TRACE file still to be written
_exit_also: list = []  # more files written from the same events at exit (RLinf's ``cluster.tracer`` output)
#: RLinf's default ``cluster.tracer.output_file``
DEFAULT_JSONL = "trace_events.jsonl"
#: the runtime above tells tracing, without being imported by it: the driver's session (or None),
#: and whether a session was shut down (``provide_runtime``, called by ``cluster``)
_driver_session = lambda: None  # noqa: E731
_is_ended = lambda session: False  # noqa: E731


def provide_runtime(driver_session, is_ended) -> None:
    """Register ``driver_session() -> session or None`` and ``is_ended(session) -> bool`` (by the runtime)."""
    global _driver_session, _is_ended
    _driver_session, _is_ended = driver_session, is_ended


def check_path(path) -> str:
    """``path`` as a str, refused with a clear error before anything starts if it cannot be written."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a trace path must be a str or os.PathLike, got {path!r}")
    path = os.fspath(path)
    if not isinstance(path, str) or not path:
        raise ValueError(f"a trace path must be a non-empty file name, got {path!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"cannot write the trace to {path!r}: folder {folder!r} does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot write the trace to {path!r}: it is a folder")
    try:  # what the write will do (a file of its own in the folder, then renamed): permissions
        export.probe_folder(folder)  # alone do not say it (root, read-only mounts, /proc)
    except OSError as exc:
        raise PermissionError(f"cannot write the trace to {path!r}: cannot create a file in {folder!r} "
                              f"({type(exc).__name__}: {exc})") from None
    return path


def on_driver_connect() -> None:
    """A driver connected to its first cluster: with ``RLINF_TRACE`` set, record and write the file at exit."""
    global _exit_registered, _exit_path
    from ..base import context

    raw = os.environ.get(TRACE_ENV)
    if not raw or context.current() is not None or _exit_registered:
        return
    path = os.path.abspath(check_path(raw))
    recorder.enable()
    import atexit

    # registered after the launcher connected, so it runs before the launcher's own exit
    # handlers (atexit runs last-registered first): the workers are still there to ask
    atexit.register(_write_at_exit, path)
    _exit_registered = True
    _exit_path = path


def on_worker_start() -> None:
    """A worker process took its environment: record if the driver traces."""
    if os.environ.get(TRACE_ENV) or os.environ.get("RLINF_TRACE_RECORD"):
        recorder.enable()


def on_cluster_config(cluster, cfg) -> None:
    """RLinf's ``cluster.tracer`` section of ``Cluster(cluster_cfg=...)``: with ``enable: true``, record in
    the driver and every worker from now on and write ``output_file`` (default ``trace_events.jsonl``;
    JSONL, or the JSON timeline if it ends in ``.json``) when the driver exits.

    Raises ``ValueError`` for a section that is not a mapping or an ``enable`` that is not a bool, and what
    ``check_path`` raises for an output file that cannot be written, before anything starts."""
    global _exit_registered
    section = (cfg or {}).get("tracer")
    if section is None:
        return
    if not hasattr(section, "get"):
        raise ValueError(f"cluster_cfg.tracer must be a mapping (enable, output_file), got {section!r}")
    enable = section.get("enable", False)
    if not isinstance(enable, bool):
        raise ValueError(f"cluster_cfg.tracer.enable must be true or false, got {enable!r}")
    if not enable:
        return
    path = os.path.abspath(check_path(section.get("output_file") or DEFAULT_JSONL))
    if path in _exit_also or path == _exit_path:
        return
    collect.start_everywhere(cluster.session)
    _exit_also.append(path)
    if not _exit_registered:
        import atexit

        atexit.register(_write_at_exit, None)
        _exit_registered = True


def write_before_exit() -> None:
    """Write the ``RLINF_TRACE`` file now, if it is due at exit: for launchers that end their workers
    before the process's exit handlers run (an ``mpiexec`` job ends its ranks when the program returns)."""
    if _exit_path is not None or _exit_also:
        _write_at_exit(_exit_path)


def _write_at_exit(path) -> None:
    global _exit_path
    paths = ([_exit_path] if _exit_path is not None else []) + _exit_also
    if not paths:  # written already
        return
    _exit_path = None
    _exit_also.clear()
    try:
        dumps, notes = collect.snapshot(_driver_session(), True)
        trace = export.chrome_trace(dumps, notes)
    except Exception as exc:  # at exit there is no caller left to raise to
        print(f"rlinf: could not gather the trace for {', '.join(paths)}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return
    for target in paths:
        try:
            written = _write(target, trace)
        except Exception as exc:
            print(f"rlinf: could not write the trace to {target}: {type(exc).__name__}: {exc}", file=sys.stderr)
        else:  # the program named the file in a variable or a config, not in a call: say where it went
            print(f"rlinf: trace written to {written or target}", file=sys.stderr)


def write_snapshot(session, path: str, drain: bool) -> str:
    """Gather every process's events (bounded) and write them to ``path``.

    If ``path`` cannot be written now (its folder was removed or made read-only since the check), the
    events, drained already, are not lost: they go to a file in the temporary folder, and the
    ``TraceWriteError`` raised names it."""
    dumps, notes = collect.snapshot(session, drain)
    return _write(path, export.chrome_trace(dumps, notes))


def _write(path: str, trace: dict) -> str:
    """Write ``trace`` to ``path``: RLinf's JSONL if it ends in ``.jsonl``, else the JSON timeline; where it
    cannot be written, to a file in the temporary folder (``TraceWriteError`` names it)."""
    try:
        if path.endswith(".jsonl"):
            return jsonl.write(path, trace)
        return export.write(path, trace)
    except OSError as exc:
        failed = f"could not write the trace to {path!r} ({type(exc).__name__}: {exc})"
        try:
            saved = export.write_elsewhere(trace)
        except OSError as again:
            raise export.TraceWriteError(f"{failed}, nor to the temporary folder ({type(again).__name__}: {again}): "
                                         f"its events are lost", None) from exc
        raise export.TraceWriteError(f"{failed}; it was written to {saved!r} instead", saved) from exc


class TraceBlock:
    """``cluster.trace(path)``: records while the ``with`` block runs and writes ``path`` when it ends.

    Already-running groups are switched on by a control call; groups launched
    inside the block record from their start.  Inside a traced run
    (``RLINF_TRACE``, an outer block) the file holds everything recorded so
    far and recording goes on.
    """

    def __init__(self, cluster, path):
        self._cluster = cluster
        self.path = os.path.abspath(check_path(path))
        self._was_on = False
        self._entered = False

    def __enter__(self) -> "TraceBlock":
        if self._entered:
            raise RuntimeError("a cluster.trace() block can be entered once")
        self._entered = True
        self._was_on = recorder.is_on()
        if not self._was_on:
            collect.start_everywhere(self._cluster.session)
        return self

    def __exit__(self, *exc) -> None:
        session = _live(self._cluster.session)
        try:
            write_snapshot(session, self.path, drain=not self._was_on)
        finally:
            if not self._was_on:
                collect.stop_everywhere(session)


def dump(cluster, path) -> str:
    """Write what has been recorded so far to ``path`` (recording goes on)."""
    path = check_path(path)
    if not recorder.is_on():
        raise RuntimeError(
            "tracing is off: set RLINF_TRACE=path.json before the driver starts, or dump inside "
            "a `with cluster.trace(path):` block"
        )
    return write_snapshot(_live(cluster.session), path, drain=False)


def _live(session):
    """``session``, or None once it was shut down: its groups' events were taken before it ended
    (``collect.keep_all_before_shutdown``), and there is nobody left to ask."""
    return None if session is None or _is_ended(session) else session
