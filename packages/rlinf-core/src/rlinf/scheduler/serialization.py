"""Shipping user classes to worker processes.

A worker class defined in ``__main__``, a notebook or a test module cannot be
imported by name in another process, so such classes travel by value
(cloudpickle).  Classes from installed packages travel by reference, as
usual, and are imported on the worker: if that import fails the launch
reports it.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading

import cloudpickle

_installed_roots = tuple(
    os.path.realpath(p)
    for p in {sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    if p
)
_lock = threading.Lock()


def _is_installed(module_name: str) -> bool:
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if module is None or path is None:
        return module_name in sys.builtin_module_names
    return os.path.realpath(path).startswith(_installed_roots)


def dumps_by_value_where_needed(obj, *modules: str) -> bytes:
    """cloudpickle ``obj``, pickling the named modules' members by value unless installed."""
    by_value = [sys.modules[m] for m in dict.fromkeys(modules) if m in sys.modules and m != "__main__" and not _is_installed(m)]
    with _lock:
        for module in by_value:
            cloudpickle.register_pickle_by_value(module)
        try:
            return cloudpickle.dumps(obj)
        finally:
            for module in by_value:
                cloudpickle.unregister_pickle_by_value(module)


def class_modules(cls: type) -> list[str]:
    """The modules of ``cls`` and of its user-defined bases."""
    return [c.__module__ for c in cls.__mro__ if c.__module__ not in ("builtins",) and not c.__module__.startswith("rlinf.")]


def dumps_worker_payload(cls: type, args: tuple, kwargs: dict) -> bytes:
    return dumps_by_value_where_needed((cls, args, kwargs), *class_modules(cls))


def loads(data: bytes):
    return cloudpickle.loads(data)
