"""RLinf's ``rlinf.scheduler.cluster.utils``: the user extension hook and the config parsing helpers.

``load_user_extension_module`` is RLinf's extension hook: ``RLINF_EXT_MODULE``
names a module (``my_pkg.rlinf_ext``) that every worker process imports, calling
its ``register()``, before the worker's class is built, so a program can
register its own environments, models, ... without patching.  The driver's
``RLINF_*`` settings reach every worker, so setting it where the program
starts is enough.  A module that fails to import, or whose ``register()``
raises, is logged and the worker goes on, as in RLinf.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
from typing import Optional

from ..plugins.cluster_config import dataclass_arg_check, parse_rank_config
from ..runtime.cluster_helpers import ClusterEnvVar, ClusterHelpers

_loaded: set = set()
_lock = threading.Lock()


def load_user_extension_module(logger: Optional[logging.Logger] = None) -> None:
    """Import the module ``RLINF_EXT_MODULE`` names and call its ``register()`` (once per process and module).

    Nothing when the variable is unset.  Import errors and errors of ``register()`` are logged, not raised
    (RLinf's behaviour); a module without ``register()`` logs a warning.

    Args:
        logger: where to log (default: the ``rlinf.scheduler`` logger).
    """
    name = ClusterHelpers.get_sys_env_var(ClusterEnvVar.EXT_MODULE)
    if not name:
        return
    log = logger or logging.getLogger("rlinf.scheduler")
    with _lock:
        if name in _loaded:
            return
        _loaded.add(name)
    try:
        module = importlib.import_module(name)
    except ImportError as exc:
        log.warning("Failed to import extension module '%s': %s", name, exc)
        return
    register = getattr(module, "register", None)
    if register is None:
        log.warning("Extension module '%s' has no register() function", name)
        return
    try:
        register()
        log.debug("Loaded extension module '%s' and called register()", name)
    except Exception:
        log.exception("Error loading extension module '%s'", name)


@contextlib.contextmanager
def without_http_proxies():
    """RLinf's context manager for its Ray state-API calls: ``NO_PROXY``/``no_proxy`` cleared of proxies for
    the block (set to the local host), restored after.  Nothing here queries an HTTP dashboard; it is
    provided for programs that wrap their own calls in it."""
    saved = {k: os.environ.get(k) for k in ("NO_PROXY", "no_proxy")}
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


__all__ = ["dataclass_arg_check", "load_user_extension_module", "parse_rank_config", "without_http_proxies"]
