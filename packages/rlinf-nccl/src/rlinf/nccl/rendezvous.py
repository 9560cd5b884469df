"""Pair setup for device transports, carried over an rlinf CPU link.

The connecting side (the "dialer", always rank 0 of the pair) hosts a
``torch.distributed.TCPStore`` on its node address and sends the store's
address, a fresh random key prefix and the core's hello over a CPU link that
the built-in ``cpu`` transport opened (so the peer is checked the way every
rlinf connection is before anything else is read).  The accepting side
(rank 1) answers on the same link with ``{"ok": ...}`` or the reason it
cannot take the pair, then both build their side of the 2-rank group under
that prefix.  The order is fixed (dialer hosts, acceptor joins), every wait
has a deadline, and each pair has its own store and group: a pair that fails
leaves every other pair alone.

The store itself does not authenticate: its address and the 128-bit prefix
travel only over the checked CPU link, and the store lives only while the
pair is being set up.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import timedelta
from typing import Optional

MAGIC = b"RLNP1"
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


def host_store(local_ip: str, deadline: Optional[float]):
    """A TCPStore server for one pair, on an OS-chosen port of this node's address."""
    import torch.distributed as dist

    return dist.TCPStore(local_ip, 0, 2, True, timeout=as_timedelta(deadline), wait_for_workers=False)


def join_store(address: tuple, deadline: Optional[float]):
    import torch.distributed as dist

    return dist.TCPStore(address[0], int(address[1]), 2, False, timeout=as_timedelta(deadline))


def new_prefix() -> str:
    return secrets.token_hex(16)


def pack_offer(store_address: tuple, prefix: str, hello: bytes, extra: dict) -> bytes:
    body = json.dumps({"store": list(store_address), "prefix": prefix, "extra": extra}).encode()
    return MAGIC + len(body).to_bytes(4, "big") + body + hello


def unpack_offer(data: bytes) -> tuple[dict, bytes]:
    """``(offer, core hello)``; ValueError for anything that is not an offer."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        raise ValueError("not a device-transport pair offer")
    n = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "big")
    start = len(MAGIC) + 4
    offer = json.loads(data[start : start + n])
    if not isinstance(offer, dict) or not isinstance(offer.get("prefix"), str) or len(offer.get("store", ())) != 2:
        raise ValueError("malformed device-transport pair offer")
    return offer, bytes(data[start + n :])


def taken(link) -> None:
    """Acknowledge the connection now (the dialer waits for that within the handshake timeout), not once
    ``local_info`` and the answer are ready: those may import torch or start CUDA first."""
    settle = getattr(link, "settle", None)
    if settle is not None:
        from rlinf.scheduler import security

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
