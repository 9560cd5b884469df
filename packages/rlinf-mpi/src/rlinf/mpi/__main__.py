"""``mpiexec -n N python -m rlinf.mpi program.py [args]``: run an rlinf program on an MPI job.

Rank 0 runs ``program.py`` (or ``-m module``) as ``__main__`` with the launcher
set to ``mpi``; every other rank hosts workers until the program ends.  The
exit status is the program's; when it ends, every rank exits.  A launch the
job has no room for (``PlacementError``, or a ``LaunchError`` before any worker
code ran) is printed as one line naming the program's line that asked; any
other error with its traceback.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys

USAGE = "usage: mpiexec -n N python -m rlinf.mpi program.py [args ...]  |  -m module [args ...]"


def _is_placement_refusal(exc: BaseException) -> bool:
    """True for a launch refused before any of its workers ran (no ranks, a bad placement, a start timeout).

    Those say all there is to say in their message; a failure inside a
    worker (it carries the worker's traceback) is not one of them.
    """
    from rlinf.scheduler.base.errors import LaunchError, PlacementError

    if isinstance(exc, PlacementError):
        return True
    return isinstance(exc, LaunchError) and not exc.remote_traceback


def _one_line(exc: BaseException) -> str:
    """``rlinf.mpi: program.py:12: PlacementError: <message>``: the program's line that asked, not rlinf's frames."""
    import rlinf

    internal = tuple(os.path.abspath(p) + os.sep for p in rlinf.__path__)
    where = ""
    tb = exc.__traceback__
    while tb is not None:  # the innermost frame of the program's own code (not rlinf's, not runpy's)
        filename = tb.tb_frame.f_code.co_filename
        path = os.path.abspath(filename)
        if not filename.startswith("<") and os.path.basename(path) != "runpy.py" and not path.startswith(internal):
            relative = os.path.relpath(path)
            where = f"{path if relative.startswith('..') else relative}:{tb.tb_lineno}: "
        tb = tb.tb_next
    return f"rlinf.mpi: {where}{type(exc).__name__}: {exc}"


def _run_program(argv: list[str]) -> int:
    from .launcher import end_job, start_driver
    from .runtime import world

    start_driver(world())
    os.environ["RLINF_LAUNCHER"] = "mpi"
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        if _is_placement_refusal(exc):
            print(_one_line(exc), file=sys.stderr)
        else:
            import traceback

            traceback.print_exc()
        code = 1
    finally:
        end_job()
    return code


def _line_buffered() -> None:
    """Flush this rank's stdout and stderr at every line.

    Under ``mpiexec`` every rank writes to pipes, which Python buffers in
    blocks: a worker's print() lines (and the driver's) would otherwise reach
    the terminal when a buffer fills or the rank ends, out of order with the
    other ranks' lines.  ``mpiexec`` copies each rank's lines as it reads them.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except (AttributeError, ValueError):  # replaced by the program, or closed: left as it is
            pass


def main(argv: list[str]) -> int:
    if argv[:1] == ["--clean-shm"] and len(argv) == 2:  # a host's cleaner, started by its lowest rank
        import json

        from .runtime import clean_shm

        clean_shm(json.loads(argv[1]))
        return 0
    _line_buffered()
    if argv[:1] == ["--serve"]:  # a worker rank spawned by a driver (RLINF_LAUNCHER=mpi)
        from . import runtime, slot

        runtime.init_spawned()
        atexit.register(runtime.finalize)
        slot.serve()
        return 0
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(USAGE, file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    from . import runtime, slot

    w = runtime.init_mpiexec()
    atexit.register(runtime.finalize)  # registered first, so it runs after the program's own exit handlers
    if w.size < 2:
        print("rlinf.mpi: the job has one rank, so no rank can host a worker; run with mpiexec -n N (N >= 2)",
              file=sys.stderr)
    if w.rank == 0:
        code = _run_program(argv)
    else:
        slot.serve()
        code = 0
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
