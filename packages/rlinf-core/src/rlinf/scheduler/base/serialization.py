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
import types

import cloudpickle
import cloudpickle.cloudpickle

_installed_roots = tuple(
    os.path.realpath(p)
    for p in {sysconfig.get_paths().get(k) for k in ("purelib", "platlib", "stdlib", "platstdlib")}
    if p
)
_lock = threading.Lock()


def _owned_here(cls: type) -> bool:
    """True if ``cls`` is this process's own class: its module and qualified name lead to it."""
    obj = sys.modules.get(getattr(cls, "__module__", None) or "")
    for part in getattr(cls, "__qualname__", "<locals>").split("."):
        obj = getattr(obj, part, None)
    return obj is cls


def keep_own_classes(cloudpickle_module) -> bool:
    """Make ``cloudpickle_module`` leave this process's own classes alone when they come back.

    A class pickled by value carries its whole definition.  When it comes back
    to the process it came from, cloudpickle's class tracker resolves it to
    that process's class (so ``isinstance`` holds) but then still writes the
    received attributes onto it: the driver's methods would be replaced by
    copies whose globals are a snapshot from the worker.  The definition is
    applied only to classes rebuilt here, never to one this process defined.
    Returns False (nothing changed) when the module has no such hook.
    """
    original = getattr(cloudpickle_module, "_class_setstate", None)
    if original is None or getattr(original, "_rlinf_keeps_own_classes", False):
        return original is not None

    def _class_setstate(obj, state):
        if _owned_here(obj):
            return obj
        return original(obj, state)

    # pickled by reference under the original's name, which now leads here
    _class_setstate.__module__, _class_setstate.__qualname__ = original.__module__, original.__qualname__
    _class_setstate._rlinf_keeps_own_classes = True
    cloudpickle_module._class_setstate = _class_setstate
    return True


keep_own_classes(cloudpickle.cloudpickle)


def _is_installed(module_name: str) -> bool:
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    if module is None or path is None:
        return module_name in sys.builtin_module_names
    return os.path.realpath(path).startswith(_installed_roots)


def dumps_by_value_where_needed(obj, *modules: str) -> bytes:
    """cloudpickle ``obj``, pickling the named modules' members by value unless installed."""
    by_value = [sys.modules[m] for m in dict.fromkeys(modules)
                if m in sys.modules and m != "__main__" and not _is_installed(m) and m not in _by_value]
    with _lock:
        for module in by_value:
            cloudpickle.register_pickle_by_value(module)
        try:
            return cloudpickle.dumps(obj)
        finally:
            for module in by_value:
                cloudpickle.unregister_pickle_by_value(module)


# -- the program's own modules: objects of their classes travel by value -------------------------------
#: cloudpickle modules (ours, and Ray's vendored copy once rlinf-ray loads) that must pickle them by value
_picklers: list = [cloudpickle]
_seen: set = set()
_seen_count = 0
_by_value: set = set()


def _inherited_entries() -> set:
    """Directories every worker process has on its import path, whatever the driver added at run time.

    The environment's ``PYTHONPATH``, the working directory and the directory of
    the script being run (launchers put both on their workers' paths, as Ray
    does), plus every ``sys.path`` entry from the standard library on (the
    interpreter's own entries, site-packages and what ``.pth`` files add there).
    """
    entries = {os.path.realpath(p or os.curdir) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    entries.add(os.path.realpath(os.curdir))
    if sys.argv and sys.argv[0] and os.path.exists(sys.argv[0]):
        entries.add(os.path.dirname(os.path.realpath(sys.argv[0])))
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    real = [os.path.realpath(p or os.curdir) for p in sys.path]
    start = real.index(stdlib) if stdlib in real else len(real)
    entries.update(real[max(start - 1, 0):])  # the stdlib zip comes just before the stdlib directory
    return entries


def _added_at_run_time(module: types.ModuleType, added: set) -> bool:
    """True if ``module`` was found on one of the ``added`` entries (``sys.path`` entries the
    program or pytest put there itself, not inherited by workers)."""
    name = module.__name__
    if name == "__main__" or name.startswith("rlinf.") or name == "rlinf" or _is_installed(name):
        return False  # __main__ goes by value anyway; the rest is importable everywhere
    top = sys.modules.get(name.partition(".")[0])
    path = getattr(top, "__file__", None)
    if not path:
        return False
    path = os.path.realpath(path)
    # the sys.path entry it was found on: the package's parent, or the module file's directory
    entry = os.path.dirname(os.path.dirname(path)) if os.path.basename(path) == "__init__.py" else os.path.dirname(path)
    return entry in added


def ship_run_time_modules_by_value() -> None:
    """Make the program's own modules travel by value, in every cloudpickle this process uses.

    A class defined in a test module (pytest puts the test directory on
    ``sys.path``) or next to a program that added its directory itself cannot
    be imported by name in a worker process.  cloudpickle ships ``__main__``'s
    classes by value already; this does the same for such modules, so their
    instances can be passed as call arguments, returned, sent and put in
    channels.  Modules importable everywhere (installed, on ``PYTHONPATH``,
    rlinf's own) keep travelling by reference.

    Cheap when called often: only modules imported since the last call are
    looked at.
    """
    global _seen_count
    if len(sys.modules) == _seen_count:
        return
    with _lock:
        names = [n for n in list(sys.modules) if n not in _seen]
        _seen_count = len(sys.modules)
        if not names:
            return
        added = {os.path.realpath(p or os.curdir) for p in sys.path} - _inherited_entries()
        for name in names:
            _seen.add(name)
            module = sys.modules.get(name)
            if added and isinstance(module, types.ModuleType) and _added_at_run_time(module, added):
                _by_value.add(name)
                for pickler in _picklers:
                    _register(pickler, module)


def also_ship_by_value_with(cloudpickle_module) -> None:
    """Register the program's own modules with another cloudpickle too (Ray's vendored copy)."""
    with _lock:
        if cloudpickle_module in _picklers:
            return
        _picklers.append(cloudpickle_module)
        for name in _by_value:
            if name in sys.modules:
                _register(cloudpickle_module, sys.modules[name])


def _register(pickler, module) -> None:
    try:
        pickler.register_pickle_by_value(module)
    except ValueError:  # registered under another name than its own (an alias): left by reference
        pass


def class_modules(cls: type) -> list[str]:
    """The modules of ``cls`` and of its user-defined bases."""
    return [c.__module__ for c in cls.__mro__ if c.__module__ not in ("builtins",) and not c.__module__.startswith("rlinf.")]


def _functions(cls: type):
    """(owner class, attribute name, function) for the plain functions a class defines."""
    for klass in cls.__mro__:
        if klass.__module__.startswith("rlinf.") or klass.__module__ == "builtins":
            continue
        for name, attr in vars(klass).items():
            fn = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
            fn = getattr(fn, "__wrapped__", fn)
            if isinstance(fn, types.FunctionType):
                yield klass, name, fn


def _with_filename(code: types.CodeType, filename: str) -> types.CodeType:
    consts = tuple(_with_filename(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def dumps_worker_payload(cls: type, args: tuple, kwargs: dict) -> bytes:
    """Pickle the class and its arguments, plus the source file of each method.

    cloudpickle drops the file names of code it pickles by value; the worker
    puts them back so that remote tracebacks point at the user's source.
    """
    filenames = {f"{k.__qualname__}.{n}": fn.__code__.co_filename for k, n, fn in _functions(cls)}
    return dumps_by_value_where_needed((cls, args, kwargs, filenames), *class_modules(cls))


def loads_worker_payload(data: bytes):
    cls, args, kwargs, filenames = cloudpickle.loads(data)
    for klass, name, fn in _functions(cls):
        filename = filenames.get(f"{klass.__qualname__}.{name}")
        if filename and fn.__code__.co_filename != filename:
            fn.__code__ = _with_filename(fn.__code__, filename)
    return cls, args, kwargs
