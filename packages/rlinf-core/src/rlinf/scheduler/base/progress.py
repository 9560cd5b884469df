"""One line saying what a long wait waits for (nodes, resources, workers).

A wait that outlasts ``RLINF_PROGRESS_AFTER`` seconds (default 5; a negative
value turns progress off) starts reporting on stderr: on a terminal as one
line rewritten in place (``\\r``), cut to the terminal's width (a longer line
would wrap, and ``\\r`` rewrite only its last row), and cleared when the
wait ends; otherwise (a log file, a pipe) as plain lines, at most one every
``RLINF_PROGRESS_EVERY`` seconds (default 10), and a last line when it ends.
The waiting code calls ``update(text)`` as often as it likes; nothing runs in
the background.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Optional, TextIO

from . import config

AFTER_ENV = "RLINF_PROGRESS_AFTER"
EVERY_ENV = "RLINF_PROGRESS_EVERY"
DEFAULT_AFTER = 5.0
DEFAULT_EVERY = 10.0
#: least seconds between two redraws of the line on a terminal
_REDRAW = 0.25


class Progress:
    """Reports one wait; use as a context manager, or call ``close()``."""

    def __init__(self, stream: Optional[TextIO] = None):
        self._stream = stream if stream is not None else sys.stderr
        self._after = config._finite_env(AFTER_ENV, DEFAULT_AFTER)
        self._every = max(0.0, config._finite_env(EVERY_ENV, DEFAULT_EVERY))
        try:
            self._tty = self._stream.isatty()
        except (AttributeError, ValueError):
            self._tty = False
        self._start = time.monotonic()
        self._shown = 0.0  # when the line was last written; 0: never
        self._width = 0
        self._text = ""

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def update(self, text: str) -> None:
        """What the wait waits for now; written when due."""
        self._text = text
        if self._after < 0:
            return
        now = time.monotonic()
        if now - self._start < self._after:
            return
        if self._shown and now - self._shown < (_REDRAW if self._tty else self._every):
            return
        self._write(text)
        self._shown = now

    def _columns(self) -> int:
        """The terminal's width now (it may have been resized); 80 if it cannot say."""
        try:
            return os.get_terminal_size(self._stream.fileno()).columns or 80
        except (AttributeError, ValueError, OSError):
            return 80

    def _write(self, text: str) -> None:
        suffix = f" ({self.elapsed:.0f} s)"
        line = f"[rlinf] {text}{suffix}"
        try:
            if self._tty:
                fits = max(20, self._columns() - 1)  # the last column would wrap on some terminals
                if len(line) > fits:
                    line = line[: max(0, fits - len(suffix) - 3)] + "..." + suffix
                    line = line[:fits]
                self._stream.write("\r" + line.ljust(min(self._width, fits)))  # padded: the last line's
                self._width = len(line)  # tail is erased, but never past the width (narrowed since, say)
            else:
                self._stream.write(line + "\n")
            self._stream.flush()
        except (OSError, ValueError):  # a closed stream: progress is best effort
            self._after = -1

    def close(self, done: str = "") -> None:
        """The wait is over: clear the line (terminal) or say ``done`` once (otherwise), if anything was shown."""
        if not self._shown:
            return
        try:
            if self._tty:
                self._stream.write("\r" + " " * self._width + "\r")
            elif done:
                self._stream.write(f"[rlinf] {done} after {self.elapsed:.0f} s\n")
            self._stream.flush()
        except (OSError, ValueError):
            pass
        self._shown = 0.0

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
