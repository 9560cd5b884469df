"""``mpiexec -n N python -m rlinf.mpi program.py [args]``: run an rlinf program on an MPI job.

Rank 0 runs ``program.py`` (or ``-m module``) as ``__main__`` with the launcher
set to ``mpi``; every other rank hosts workers until the program ends.  The
exit status is the program's; when it ends, every rank exits.
"""

from __future__ import annotations

import atexit
import os
import runpy
import sys

USAGE = "usage: mpiexec -n N python -m rlinf.mpi program.py [args ...]  |  -m module [args ...]"


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
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        end_job()
    return code


def main(argv: list[str]) -> int:
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
