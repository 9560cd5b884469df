"""Run every example in its own interpreter and report each one.

    python examples/run_all.py
"""

import os
import subprocess
import sys
import time

EXAMPLES = ["quickstart.py", "worker_group.py", "communication.py", "timing.py"]


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)  # each example runs as a user runs it: nothing added
    failed = []
    for name in EXAMPLES:
        start = time.monotonic()
        print(f"=== {name}", flush=True)
        try:
            proc = subprocess.run([sys.executable, os.path.join(here, name)], env=env, timeout=300)
            ok = proc.returncode == 0
        except subprocess.TimeoutExpired:
            ok = False
        print(f"=== {name}: {'ok' if ok else 'FAILED'} ({time.monotonic() - start:.1f} s)", flush=True)
        if not ok:
            failed.append(name)
    print(f"{len(EXAMPLES) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
