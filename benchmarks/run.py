"""Run one benchmark by name: ``python benchmarks/run.py group|p2p|channel|mpi [options]``."""

from __future__ import annotations

import importlib
import os
import sys

BENCHMARKS = {"group": "group", "p2p": "p2p", "channel": "channel", "mpi": "mpi", "gloo": "gloo"}


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHMARKS:
        print(f"usage: run.py {{{'|'.join(BENCHMARKS)}}} [options]", file=sys.stderr)
        return 2
    module = importlib.import_module(BENCHMARKS[sys.argv[1]])
    module.main(sys.argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
