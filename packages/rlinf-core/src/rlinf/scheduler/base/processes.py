"""Whether a process of this host still runs, a zombie counting as ended."""

from __future__ import annotations

import os

__all__ = ["process_running"]


def process_running(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie has ended too, although ``kill(pid, 0)`` still finds it (a
    driver whose parent has not reaped it yet, a worker whose launcher has not).  Where ``/proc`` hides
    the process (``hidepid``) the kernel is asked; a process of another user counts as running.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # the name may hold anything
    except FileNotFoundError:
        pass  # gone, or hidden: ask the kernel
    except (OSError, IndexError):
        return True
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
