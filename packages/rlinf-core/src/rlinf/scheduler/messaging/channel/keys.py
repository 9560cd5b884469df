"""Channel keys: any hashable value, named on the wire by a canonical token.

Two keys name the same queue exactly when Python considers them the same
dict key, whichever process uses them: ``1``, ``1.0`` and ``True`` are one
key, ``("a", 1)`` is the same key in every process, and a ``str`` is sent
as itself.  Unhashable values (a list such as ``["a", 1]``, a dict) are
rejected with ``TypeError``, as a ``dict`` would: a key must not change
while items wait under it.  A tuple and a list are therefore never confused.
"""

from __future__ import annotations

import enum
import json
import zlib


def key_token(key) -> str:
    """The wire name of ``key``'s queue; raises TypeError for an unhashable key."""
    if type(key) is str:
        return key
    try:
        hash(key)
    except TypeError:
        raise TypeError(f"a channel key must be hashable (like a dict key), got {type(key).__name__} {key!r}; "
                        f"use a tuple instead of a list") from None
    return "\x1f" + json.dumps(_canonical(key), separators=(",", ":"), ensure_ascii=False)


def _canonical(value):
    if isinstance(value, enum.Enum):
        return ["e", f"{type(value).__module__}.{type(value).__qualname__}", value.name]
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int)):
        return ["i", int(value)]
    if isinstance(value, float):
        return ["i", int(value)] if value.is_integer() else ["f", value.hex()]
    if value is None:
        return ["n"]
    if isinstance(value, bytes):
        return ["b", value.hex()]
    if isinstance(value, tuple):
        return ["t", [_canonical(v) for v in value]]
    if isinstance(value, frozenset):
        return ["s", sorted((_canonical(v) for v in value), key=lambda c: json.dumps(c))]
    # any other hashable: its type and repr (stable for value types whose repr shows their value)
    return ["o", f"{type(value).__module__}.{type(value).__qualname__}", repr(value)]


def replica_of(token: str, replicas: int) -> int:
    """Which of a distributed channel's replicas holds a key: the same in every process."""
    return 0 if replicas <= 1 else zlib.crc32(token.encode()) % replicas


def show_key(token: str) -> str:
    """A token as people read a key, in messages and ``status``: ``'default_queue'``, ``('a', 1)``, ``3``."""
    if not token.startswith("\x1f"):
        return repr(token)
    try:
        return _shown(json.loads(token[1:]))
    except (ValueError, TypeError, IndexError, KeyError):  # not a token this module made: as it is
        return token[1:]


def plain_key(key) -> str:
    """A key as the timeline labels it: a ``str`` as itself (no quotes), any other key as ``show_key`` shows it."""
    return key if type(key) is str else show_key(key_token(key))


def _shown(canon) -> str:
    """The Python-like text of a canonical value (``_canonical``'s inverse, for display)."""
    if isinstance(canon, str):
        return repr(canon)
    tag = canon[0]
    if tag == "i":
        return str(canon[1])
    if tag == "f":
        return repr(float.fromhex(canon[1]))
    if tag == "n":
        return "None"
    if tag == "b":
        return repr(bytes.fromhex(canon[1]))
    if tag == "t":
        items = [_shown(v) for v in canon[1]]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if tag == "s":
        return "frozenset({" + ", ".join(_shown(v) for v in canon[1]) + "})"
    if tag == "e":
        return f"{canon[1].rsplit('.', 1)[-1]}.{canon[2]}"
    return canon[2]  # "o": the value's repr


class OpLabel:
    """An operation as its errors name it (``get on channel 'c' key 'k'``), written only when one is."""

    __slots__ = ("op", "channel", "key")

    def __init__(self, op: str, channel: str, key: str):
        self.op, self.channel, self.key = op, channel, key

    def __str__(self) -> str:
        return f"{self.op} on channel {self.channel!r} key {show_key(self.key)}"
