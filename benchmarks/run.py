"""Run one benchmark by name: ``python benchmarks/run.py group|p2p|channel|routed|mpi [--smoke] [--check] [options]``.

``--smoke`` runs it with tiny sizes in a few seconds (CI runs every benchmark
this way so none can rot; its numbers mean nothing).  ``--check`` exits with
status 1 when a same-run target is missed; machines are noisy, so CI does not
use it.  Plots go to ``benchmarks/results/`` (``RLINF_BENCH_RESULTS`` overrides).
"""

from __future__ import annotations

import importlib
import os
import sys

BENCHMARKS = {"group": "group", "p2p": "p2p", "channel": "channel", "mpi": "mpi", "gloo": "gloo",
              "weights": "weights", "weights-hosts": "weights_hosts", "trace": "trace_overhead", "scale": "scale",
              "routed": "routed"}


def exit_status(missed: list, check: bool) -> int:
    """0, or 1 when ``check`` is on and a target was missed."""
    if missed and check:
        print(f"{len(missed)} target(s) missed: " + "; ".join(t.measure for t in missed), file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: run.py {{{'|'.join(BENCHMARKS)}}} [--smoke] [--check] [options]", file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    module = importlib.import_module(BENCHMARKS[name])
    from common import report_targets

    targets = module.main(rest)  # --smoke and --check are options of every benchmark's own parser
    check = "--check" in rest
    return exit_status(report_targets(targets or []), check)


if __name__ == "__main__":
    sys.exit(main())
