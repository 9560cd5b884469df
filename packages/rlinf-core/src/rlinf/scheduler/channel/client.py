"""The client side of a channel: one connection per process per channel.

Requests carry ids; a reader thread hands each reply to the future of its
request, so any number of blocking and asynchronous operations, on any keys
and from any threads, share the connection without ever receiving another
caller's item.  If the host goes away every pending operation fails at once.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import os
import threading
import uuid
from typing import Optional

from ..errors import CommunicationError, PeerDiedError
from ..p2p.transport import Link
from .protocol import control, pack

#: seconds a client waits beyond an operation's own timeout for the host's reply
REPLY_GRACE = 10.0


class ChannelClient:
    def __init__(self, channel: str, host: str, link: Link):
        self.channel = channel
        self.host = host
        self._link = link
        self._ids = itertools.count(1)
        self._pending: dict[int, concurrent.futures.Future] = {}
        self._lock = threading.Lock()
        self._dead: Optional[str] = None
        threading.Thread(target=self._read_replies, name=f"rlinf-channel-{channel}-replies", daemon=True).start()

    @classmethod
    def connect(cls, channel: str, host_name: str, record) -> "ChannelClient":
        from ..plugins import get_registry

        registry = get_registry()
        entry = registry.transport(None, "cpu")  # this process's default, if the host offers it
        if entry.name not in record.endpoints and "cpu" in record.endpoints:
            entry = registry.transport("cpu", "cpu")
        endpoint = record.endpoints.get(entry.name)
        if endpoint is None:
            raise CommunicationError(f"the host of channel {channel!r} offers no transport this process can use "
                                     f"(it offers {sorted(record.endpoints)})", peer=host_name)
        transport = _client_transport(entry)
        hello = json.dumps({"service": "channel", "channel": channel, "client": f"{os.getpid()}-{uuid.uuid4().hex[:6]}"})
        return cls(channel, host_name, transport.connect(endpoint, hello.encode(), None))

    def _read_replies(self) -> None:
        while True:
            try:
                _raw, frames = self._link.recv(None)
            except Exception as exc:
                self._fail_all(f"the connection to the host of channel {self.channel!r} ({self.host}) was lost: {exc}")
                return
            ctrl = control(frames[0])
            with self._lock:
                fut = self._pending.pop(ctrl["id"], None)
            if fut is not None and not fut.done():
                fut.set_result((ctrl, frames[1:]))

    def _fail_all(self, reason: str) -> None:
        with self._lock:
            self._dead = reason
            pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(PeerDiedError(reason, peer=self.host))

    def request(self, ctrl: dict, frames=()) -> tuple[int, concurrent.futures.Future]:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._dead:
                raise PeerDiedError(self._dead, peer=self.host)
            rid = next(self._ids)
            self._pending[rid] = fut
        ctrl["id"] = rid
        try:
            self._link.send([pack(ctrl), *frames], None)
        except Exception as exc:
            with self._lock:
                self._pending.pop(rid, None)
            raise PeerDiedError(f"cannot reach the host of channel {self.channel!r} ({self.host}): {exc}", peer=self.host) from None
        return rid, fut

    def cancel(self, rid: int) -> None:
        with self._lock:
            self._pending.pop(rid, None)
        try:
            self._link.send([pack({"id": 0, "op": "cancel", "target": rid})], None)
        except Exception:
            pass

    def close(self) -> None:
        self._link.close()


_transports: dict = {}
_transports_lock = threading.Lock()


def _client_transport(entry):
    """A transport instance used only to connect (clients do not listen)."""
    with _transports_lock:
        t = _transports.get(entry.name)
        if t is None:
            t = _transports[entry.name] = entry.descriptor.factory()
        return t
