"""Files written whole: a reader never sees half of one, and a failed write leaves nothing behind.

Each is written as a new file beside its path (``mkstemp``: mode 0600, never opened through a link)
and renamed over the path, so a link another user planted there is replaced, not written through.
Used for the trace files (``tracing.export``, profiler windows) and the files a job publishes for the
status command (``status_dir``).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Callable, Optional


def write_new(body, folder: Optional[str], prefix: str, suffix: str, compact: bool = False) -> str:
    """``body`` as JSON in a new file of ``folder`` (the temporary folder if None), mode 0600 (``mkstemp``);
    the file is removed if the write fails.  Returns its path."""
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, separators=(",", ":") if compact else None)
    except BaseException:
        _unlink(path)
        raise
    return path


def replace(path: str, body, tmp_prefix: str, tmp_suffix: str, compact: bool = False) -> str:
    """Write ``body`` as JSON to ``path`` atomically (``replace_by``)."""

    def fill(tmp: str) -> None:
        with open(tmp, "w") as f:
            json.dump(body, f, separators=(",", ":") if compact else None)

    return replace_by(path, fill, tmp_prefix, tmp_suffix)


def replace_by(path: str, fill: Callable[[str], None], tmp_prefix: str, tmp_suffix: str) -> str:
    """``fill(tmp)`` writes a new file beside ``path`` (it may write it anew), which is then made 0600 and
    renamed over ``path``; removed if anything fails.  Returns ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=tmp_prefix, suffix=tmp_suffix, dir=os.path.dirname(os.path.abspath(path)))
    os.close(fd)
    try:
        fill(tmp)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    return path


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
