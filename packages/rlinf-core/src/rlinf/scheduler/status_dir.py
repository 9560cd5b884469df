"""Where a job on this machine publishes what ``python -m rlinf.scheduler status`` needs.

A per-user directory (``$RLINF_STATUS_DIR``, else ``$XDG_RUNTIME_DIR/rlinf``,
else ``<tmp>/rlinf-<uid>``), made with mode 0700 and refused if another user
owns it or others can write to it, so that the tokens in its files (mode 0600)
stay the user's.
"""

from __future__ import annotations

import os
import stat
import tempfile

STATUS_DIR_ENV = "RLINF_STATUS_DIR"


def status_dir() -> str:
    explicit = os.environ.get(STATUS_DIR_ENV)
    if explicit:
        return explicit
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return os.path.join(runtime, "rlinf")
    return os.path.join(tempfile.gettempdir(), f"rlinf-{os.getuid()}")


def private_status_dir(create: bool) -> str:
    """The directory, checked (and made when ``create``); raises ``PermissionError`` if it is not private."""
    path = status_dir()
    if create:
        os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"{path} must be a directory of uid {os.getuid()} with mode 0700 (it holds status tokens)")
    return path
