"""Naming the part of a worker method's return value that cannot be pickled.

Ray pickles a method's return value after the method returned, outside any
code of ours: when that fails, the driver hears only pickle's ``TypeError:
cannot pickle '_thread.lock' object`` with Ray's traceback through its own
serializer, as if the call had not started.  So, in the worker process only,
Ray's serializer is wrapped (``install``): when it fails on a value a
forwarder has just returned (``expect``), it raises ``UnpicklableError``
instead, naming the path to the part that does not pickle (``result['state']``,
as ``send`` does, see ``rlinf.scheduler.base.unpicklable``); the driver
reports it as a failure of the method's return value (``launcher._rejected``).
The wrapper costs a set lookup per result; the walk runs only after a
failure.  A Ray whose serializer is not where this module expects it is left
as it is, and the plain error comes through.
"""

from __future__ import annotations

import collections
import threading

from rlinf.scheduler.base.unpicklable import unpicklable_error

#: ids of the values forwarders returned that Ray has not serialized yet (bounded: a value whose
#: serialization never comes, after an interrupt say, gives way to newer ones)
_expected: "collections.OrderedDict[int, str]" = collections.OrderedDict()
_MAX_EXPECTED = 1024
_lock = threading.Lock()
_installed = False


def expect(value, method: str):
    """Note that ``value`` is what ``method`` returns to Ray; return ``value``."""
    with _lock:
        _expected[id(value)] = method
        while len(_expected) > _MAX_EXPECTED:
            _expected.popitem(last=False)
    return value


def _user_value(value):
    """The method's own return value inside the wire form (``logs.Marked``, ``launcher.Timed``)."""
    from rlinf.scheduler.plugins.launcher import Timed

    from .logs import Marked

    if type(value) is Marked:
        value = value.wire
    if type(value) is Timed:
        value = value.value
    return value


def install() -> None:
    """In a worker process: wrap Ray's serializer as the module says (once; idempotent)."""
    global _installed
    if _installed:
        return
    try:
        from ray._private.serialization import SerializationContext
    except ImportError:
        return
    original = getattr(SerializationContext, "serialize", None)
    if original is None:
        return

    def serialize(self, value):
        with _lock:
            method = _expected.pop(id(value), None)
        try:
            return original(self, value)
        except Exception as exc:
            if method is None:
                raise
            raise unpicklable_error(f"the return value of {method}()", _user_value(value), exc, "result") from None

    serialize.__wrapped__ = original
    SerializationContext.serialize = serialize
    _installed = True
