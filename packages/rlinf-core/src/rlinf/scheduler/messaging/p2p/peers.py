"""Finding peers: group records from the launcher's registry, and waiting for a peer to connect.

Group records are cached per group (``_lookup``): registry traffic follows the
groups a worker talks to, refreshed only when a peer looks gone or relaunched.
A receiver waiting for a peer's connection probes the peer's process every
``PROBE_INTERVAL`` seconds, so a sender that died is reported instead of waited
for, and one replaced by a relaunched group of the same name is waited for anew.

``PeersMixin`` is one part of ``Communicator`` (communicator.py), which holds
the state it uses.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Optional

from ...base.address import WorkerAddress, describe_running
from ...base.errors import CommunicationError
from ...plugins.launcher import current_session
from ...plugins.transport import Link, Transport

#: seconds between liveness probes of a peer we are waiting for
PROBE_INTERVAL = 1.0


class PeersMixin:
    """Peer lookup and the wait for a peer's connection (with liveness probes), for ``Communicator``."""

    name: str
    stats: dict
    _cond: threading.Condition
    _groups: dict[str, Any]
    _lookup_locks: dict[str, threading.Lock]
    _transports: dict[str, Transport]
    _in: dict

    def _lookup(self, peer: WorkerAddress, refresh: bool = False):
        key = peer.group_key
        record = None if refresh else self._groups.get(key)
        if record is None:
            with self._cond:
                lock = self._lookup_locks.setdefault(key, threading.Lock())
            # one fetch per group at a time: the other senders of an all-to-all wait for it instead of
            # asking too (bounded: the launcher bounds every registry request)
            with lock:
                record = None if refresh else self._groups.get(key)
                if record is None:
                    record = self._fetch(peer)
        if peer.rank >= len(record.workers):
            raise CommunicationError(
                f"{self.name}: rank {peer.rank} is out of range for group {key!r} of {len(record.workers)} worker(s)",
                peer=peer.get_name(),
            )
        return record.workers[peer.rank]

    def _fetch(self, peer: WorkerAddress):
        key = peer.group_key
        self.stats["registry_lookups"] += 1
        record = current_session().lookup_group(key)
        if record is None:
            raise CommunicationError(
                f"{self.name}: no group named {key!r} is running in this cluster "
                f"(running: {describe_running(current_session().list_groups())})",
                peer=peer.get_name(),
            )
        self._groups[key] = record
        return record

    def _relookup(self, peer: WorkerAddress, why: str = ""):
        """The peer's record fetched afresh; ``ConnectionError`` (after ``why``) if its group is gone."""
        try:
            return self._lookup(peer, refresh=True)
        except CommunicationError:
            raise ConnectionError(f"{why}its group is no longer running") from None

    def _describe(self, peer: WorkerAddress) -> str:
        try:
            info = self._lookup(peer).info
            return f"worker {peer.get_name()!r} (group {peer.group_key!r} rank {peer.rank}, node {info.node_id}, {info.node_ip}, pid {info.pid})"
        except CommunicationError:
            return f"worker {peer.get_name()!r}"

    def _incoming(self, peer: WorkerAddress, transport: str, deadline: Optional[float], ended: bool = False) -> Link:
        """The link to receive from ``peer`` on, waiting for the peer to connect.

        ``ended``: the previous link from this peer just ended, so a peer whose
        process is gone is reported at once instead of after a probe interval.
        """
        pair = self._pair(self._in, peer.get_name())
        link = pair.link
        if link is None:
            # after a link ended, the cached record stays: the probe below refreshes it only if the
            # sender's process is gone (a relaunched group), so an idle close costs no registry call
            try:
                record = self._lookup(peer)  # validates group and rank before waiting
            except CommunicationError:
                if ended:
                    raise ConnectionError("its group is no longer running") from None
                raise
            next_probe = time.monotonic() + (0.0 if ended else PROBE_INTERVAL)
            while True:
                with self._cond:
                    if pair.link is not None:
                        link = pair.link
                        break
                    now = time.monotonic()
                    if deadline is not None and now >= deadline:
                        raise TimeoutError("no connection from the peer")
                    if now < next_probe:
                        self._cond.wait(next_probe - now if deadline is None else min(next_probe, deadline) - now)
                        continue
                record = self._check_alive(peer, record, transport)  # outside the lock: it may take a while
                next_probe = time.monotonic() + PROBE_INTERVAL
        if pair.transport != transport:
            raise CommunicationError(
                f"{self.name}: {peer.get_name()!r} sends with transport {pair.transport!r} but this side "
                f"receives with {transport!r}; both ends of a pair must agree",
                peer=peer.get_name(),
            )
        return link

    def _check_alive(self, peer: WorkerAddress, record, transport: str):
        """Probe the process we wait for; return the record to keep waiting on, or raise if it is gone.

        A process that is gone may have been replaced by a relaunched group of
        the same name, which is about to connect: then wait for the new one.
        """
        endpoint = record.endpoints.get(transport) or next(iter(record.endpoints.values()), None)
        probe_with = self._transports.get(transport)
        if endpoint is None or probe_with is None or probe_with.probe(endpoint):
            return record
        fresh = self._relookup(peer)
        if fresh.endpoints == record.endpoints:
            raise ConnectionError("the peer's process is gone")
        return fresh
