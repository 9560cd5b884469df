"""Pair setup for device transports, carried over an rlinf CPU link.

The connecting side (the "dialer", always rank 0 of the pair) opens a link
of the built-in ``cpu`` transport (so the peer is checked the way every rlinf
connection is before anything else is read) and sends its offer on it: the
core's hello and what the backend needs (NCCL: the device; CuPy: the NCCL
unique id; the tuning fields).  The accepting side (rank 1) answers on the
same link with ``{"ok": ...}`` or the reason it cannot take the pair, then
both build their side of the 2-rank group.  The keys gloo and NCCL exchange
to do so travel on that same link (``link_store.LinkStore``): no store
listens anywhere, during setup or after.  The order is fixed (dialer offers,
acceptor answers), every wait has a deadline, and each pair has its own
group: a pair that fails leaves every other pair alone.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Optional

#: offers of this version (1 carried a TCPStore's address: see ``unpack_offer``)
MAGIC = b"RLNP2"
_OLD_MAGIC = b"RLNP1"
#: seconds pair setup may take when the caller gave no deadline
DEFAULT_SETUP = 120.0


def remaining(deadline: Optional[float], default: float = DEFAULT_SETUP) -> float:
    """Seconds left before ``deadline`` (``time.monotonic`` based); TimeoutError when none are."""
    if deadline is None:
        return default
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def as_timedelta(deadline: Optional[float], default: float = DEFAULT_SETUP) -> timedelta:
    return timedelta(seconds=remaining(deadline, default))


def pack_offer(hello: bytes, extra: dict) -> bytes:
    body = json.dumps({"extra": extra}).encode()
    return MAGIC + len(body).to_bytes(4, "big") + body + hello


def unpack_offer(data: bytes) -> tuple[dict, bytes]:
    """``(offer, core hello)``; ValueError for anything that is not an offer."""
    if data.startswith(_OLD_MAGIC):
        raise ValueError("the peer runs an older rlinf-nccl (pair setup through a TCPStore); "
                         "install the same rlinf-nccl on both ends")
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        raise ValueError("not a device-transport pair offer")
    n = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "big")
    start = len(MAGIC) + 4
    offer = json.loads(data[start : start + n])
    if not isinstance(offer, dict) or not isinstance(offer.get("extra"), dict):
        raise ValueError("malformed device-transport pair offer")
    return offer, bytes(data[start + n :])


def taken(link) -> None:
    """Acknowledge the connection now (the dialer waits for that within the handshake timeout), not once
    ``local_info`` and the answer are ready: those may import torch or start CUDA first."""
    settle = getattr(link, "settle", None)
    if settle is not None:
        from rlinf.scheduler.base import security

        settle(security.handshake_deadline())


def answer(link, deadline: Optional[float], error: Optional[str] = None, **info) -> None:
    """The acceptor's reply on the CPU link: go ahead (with ``info``) or the reason it refuses."""
    link.send([json.dumps({"ok": error is None, "error": error, **info}).encode()], deadline)


def await_answer(link, deadline: Optional[float]) -> dict:
    _, frames = link.recv(deadline)
    reply = json.loads(bytes(frames[0]))
    if not reply.get("ok"):
        raise ConnectionError(f"the peer refused the pair: {reply.get('error')}")
    return reply
