"""The calls a worker process is running right now, and since when.

``WorkerHost`` notes each call as it starts and forgets it as it returns
(an async worker can have many at once), so that ``python -m rlinf.scheduler
status`` can say what every worker is doing and for how long.  Two dict
operations and a clock read per call: cheap enough for the hot path.
"""

from __future__ import annotations

import itertools
import time

_running: dict[int, tuple[str, float, float]] = {}  # token -> (method, wall-clock start, monotonic start)
_tokens = itertools.count(1)  # next() is atomic under the GIL


def begin(method: str) -> int:
    """Note that ``method`` started; pass the token to ``end``."""
    token = next(_tokens)
    _running[token] = (method, time.time(), time.monotonic())
    return token


def end(token: int) -> None:
    _running.pop(token, None)


def current() -> list[dict]:
    """The running calls, oldest first: method, when it started (epoch seconds) and for how long it has run."""
    now = time.monotonic()
    entries = sorted(list(_running.values()), key=lambda e: e[2])  # a copy: calls start and end meanwhile
    return [{"method": m, "started": round(wall, 3), "running_s": round(now - mono, 3)} for m, wall, mono in entries]


def forget() -> None:
    """The worker is released: its calls are over."""
    _running.clear()
