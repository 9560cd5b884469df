"""A ``torch.distributed.Store`` for one pair, carried over the pair's authenticated CPU link.

gloo and NCCL rendezvous through a store: each rank writes a few keys (its
listener's address, the NCCL unique id) and reads the other's.  A
``TCPStore`` for that would listen on the node address for anyone to read and
write; this store listens nowhere.  Each end keeps the keys in a local dict;
a write is applied here and sent to the peer on the CPU link, which the
built-in ``cpu`` transport opened with rlinf's handshake, and a read of a key
not here yet takes the peer's writes off that link until it arrives (or the
deadline passes).

Setup ends with ``finish``: each end says it is done and takes the peer's
remaining writes up to the peer's own "done", so that the link then carries
only the pair's traffic.  Past that point the store is local: torch may
still call it from its own threads (NCCL's watchdog checks a key or two),
and such calls never touch the link again.

Messages: ``[MAGIC, op, key, value]`` with ``op`` one of ``set``, ``add``,
``app`` (append), ``del``, ``end``; never pickled.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Optional

import torch.distributed as dist

MAGIC = b"RLNS1"


class LinkStore(dist.Store):
    """The pair's store: local keys, written through to the peer over ``link`` until ``finish``.

    The Python object must outlive every C++ user of the store (pybind calls
    the Python methods through it): the pair's link keeps a reference for as
    long as the pair's process group lives.
    """

    def __init__(self, link, deadline: float):
        super().__init__()
        self._link = link
        self._deadline = deadline
        self._data: dict[str, bytes] = {}
        self._cond = threading.Condition()
        self._reading = threading.Lock()  # one thread at a time takes messages off the link
        self._sending = threading.Lock()
        self._sent_end = False  # after our "end", writes stay here
        self._peer_done = False  # after the peer's "end", nothing more is read from the link

    # -- the link -------------------------------------------------------------------------
    def _tell(self, op: bytes, key: str, value: bytes = b"") -> None:
        with self._sending:
            if not self._sent_end:
                self._link.send([MAGIC, op, key.encode(), value], self._deadline)
                self._sent_end = op == b"end"

    def _take_one(self, deadline: float) -> None:
        """Apply the peer's next message (the caller holds ``_reading``)."""
        _, frames = self._link.recv(deadline)
        frames = [bytes(f) for f in frames]
        if len(frames) != 4 or frames[0] != MAGIC:
            raise ConnectionError("the peer sent something other than rendezvous keys during pair setup")
        _, op, key, value = frames
        key = key.decode()
        with self._cond:
            if op == b"end":
                self._peer_done = True
            else:
                self._apply(op, key, value)
            self._cond.notify_all()

    def _apply(self, op: bytes, key: str, value: bytes) -> bytes:
        """One write to the local keys (the caller holds ``_cond``); returns the key's new value."""
        if op == b"set":
            self._data[key] = value
        elif op == b"add":
            self._data[key] = str(int(self._data.get(key, b"0")) + int(value)).encode()
        elif op == b"app":
            self._data[key] = self._data.get(key, b"") + value
        elif op == b"del":
            self._data.pop(key, None)
            return b""
        else:
            raise ConnectionError(f"unknown rendezvous operation {op[:16]!r} from the peer")
        return self._data[key]

    def _write(self, op: bytes, key: str, value: bytes) -> bytes:
        with self._cond:
            new = self._apply(op, key, value)
            self._cond.notify_all()
        self._tell(op, key, value)
        return new

    def _await(self, keys, deadline: float) -> None:
        """Until every key in ``keys`` is here; TimeoutError past ``deadline``."""
        while True:
            with self._cond:
                if all(k in self._data for k in keys):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"rendezvous keys {list(keys)} did not arrive before the deadline")
                if self._peer_done:  # only a write from this end could still bring them
                    self._cond.wait(left)
                    continue
            if not self._reading.acquire(timeout=left):
                continue  # another thread read until the deadline: checked above
            try:
                with self._cond:
                    if self._peer_done or all(k in self._data for k in keys):
                        continue
                self._take_one(deadline)
            finally:
                self._reading.release()

    def finish(self, deadline: float) -> None:
        """End setup: say so, and take the peer's writes up to its own end of setup."""
        self._tell(b"end", "")
        if not self._reading.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError("pair setup did not end before the deadline")
        try:
            while not self._peer_done:
                self._take_one(deadline)
        finally:
            self._reading.release()

    def _wait_deadline(self, timeout: Optional[timedelta]) -> float:
        if timeout is None:
            return self._deadline
        return min(self._deadline, time.monotonic() + timeout.total_seconds())

    # -- torch.distributed.Store (the names pybind looks up) -------------------------------
    def set(self, key, value):
        self._write(b"set", key, bytes(value))

    def get(self, key):
        self._await([key], self._deadline)
        with self._cond:
            return self._data[key]

    def add(self, key, value):
        return int(self._write(b"add", key, str(int(value)).encode()))

    def append(self, key, value):
        self._write(b"app", key, bytes(value))

    def compare_set(self, key, expected, desired):
        with self._cond:
            current = self._data.get(key)
            if (current is None and bytes(expected)) or (current is not None and current != bytes(expected)):
                return current if current is not None else bytes(expected)
        self._write(b"set", key, bytes(desired))
        return bytes(desired)

    def deleteKey(self, key):
        with self._cond:
            present = key in self._data
        self._write(b"del", key, b"")
        return present

    def getNumKeys(self):
        with self._cond:
            return len(self._data)

    def check(self, keys):
        with self._cond:
            return all(k in self._data for k in keys)

    def wait(self, keys, timeout=None):
        # timeout None: torch's "the store's own"; bounded by the pair's setup deadline either way
        self._await(list(keys), self._wait_deadline(timeout))

    def multi_get(self, keys):
        self._await(list(keys), self._deadline)
        with self._cond:
            return [self._data[k] for k in keys]

    def multi_set(self, keys, values):
        for key, value in zip(keys, values):
            self.set(key, value)

    def clone(self):
        return self  # thread-safe as it is: every clone would share these keys anyway

    def has_extended_api(self):
        return True
