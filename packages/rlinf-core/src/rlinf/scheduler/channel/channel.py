"""``Channel``: a named FIFO queue with one independent queue per key.

A channel lives in a small host worker on the node asked for.  Producers and
consumers (workers or the driver) hold a ``Channel`` object, which can be
passed to workers as an argument; each process connects to the host once and
sends items over the fast point-to-point transport.  Items are encoded by
the producer and decoded by the consumer only: tensors travel as raw bytes
and keep their devices, and the host never unpickles anything.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from typing import Any, Optional

from .. import config
from ..address import validate_group_name
from ..errors import CommTimeoutError, CommunicationError, GroupNameError, PeerDiedError
from ..worker import Worker
from .client import REPLY_GRACE, ChannelClient

DEFAULT_KEY = "default_queue"
_GROUP_PREFIX = "Channel."
#: seconds connect() waits for a channel that another process is creating
CONNECT_WAIT = 10.0


class ChannelHostWorker(Worker):
    """The worker that hosts one channel's queues."""

    def __init__(self, channel_name: str, maxsize: int):
        super().__init__()
        from ..p2p.communicator import local_communicator
        from .server import ChannelServer

        self._server = ChannelServer(channel_name, maxsize)
        local_communicator(create=True).add_service("channel", self._server.on_connect)

    def ping(self) -> bool:
        return True

    def stats(self) -> dict:
        """Live bookkeeping: keys with state, and items queued."""
        return self._server.stats()


def _group_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a channel name must be a non-empty str, got {name!r}")
    return validate_group_name(_GROUP_PREFIX + name)


def _check_maxsize(maxsize) -> int:
    if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
        raise ValueError(f"maxsize must be an int >= 0 (0: unbounded), got {maxsize!r}")
    return maxsize


def _check_key(key) -> str:
    if not isinstance(key, str) or not key:
        raise TypeError(f"a channel key must be a non-empty str, got {key!r}")
    return key


_hosts: dict[str, Any] = {}  # channel name -> host group launched by this process (keeps the actor alive)
_clients: dict[str, ChannelClient] = {}
_lock = threading.Lock()


class Channel:
    """A named, bounded FIFO channel; see ``Channel.create`` and ``Channel.connect``."""

    def __init__(self, name: str, maxsize: int = 0):
        self._name = name
        self._group = _group_name(name)
        self._maxsize = maxsize

    # -- creation ---------------------------------------------------------------
    @classmethod
    def create(cls, name: str, maxsize: int = 0, node_id: int = 0, cluster=None) -> "Channel":
        """Create the channel on node ``node_id``, or connect to it if it exists."""
        from ..cluster import Cluster
        from ..placement import NodePlacementStrategy

        group = _group_name(name)
        maxsize = _check_maxsize(maxsize)
        if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id < 0:
            raise ValueError(f"node_id must be an int >= 0, got {node_id!r}")
        cluster = cluster or Cluster()
        with _lock:
            if name in _hosts:
                return cls(name, maxsize)
            try:
                host = ChannelHostWorker.create_group(name, maxsize).launch(
                    cluster, placement_strategy=NodePlacementStrategy([node_id]), name=group
                )
            except GroupNameError:
                return cls.connect(name)
            _hosts[name] = host
        return cls(name, maxsize)

    @classmethod
    def connect(cls, name: str, timeout: float = CONNECT_WAIT) -> "Channel":
        """Connect to an existing channel (waiting up to ``timeout`` s for it to appear)."""
        from ..cluster import current_session

        timeout = config.check_timeout(timeout) or CONNECT_WAIT
        group = _group_name(name)
        session = current_session()
        deadline = time.monotonic() + timeout
        while True:
            record = session.lookup_group(group)
            if record is not None:
                return cls(name)
            if time.monotonic() >= deadline:
                raise CommunicationError(f"no channel named {name!r} exists (create it with create_channel / Channel.create)")
            time.sleep(0.05)

    def __reduce__(self):
        return (Channel, (self._name, self._maxsize))

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"Channel({self._name!r})"

    # -- plumbing -----------------------------------------------------------------
    def _client(self) -> ChannelClient:
        client = _clients.get(self._name)
        if client is not None and client._dead is None:
            return client
        with _lock:
            client = _clients.get(self._name)
            if client is None or client._dead is not None:
                from ..cluster import current_session

                record = current_session().lookup_group(self._group)
                if record is None:
                    raise CommunicationError(f"channel {self._name!r} no longer exists (its host stopped)")
                host = record.workers[0]
                try:
                    client = ChannelClient.connect(self._name, self._group + ":0", host)
                except OSError as exc:
                    raise PeerDiedError(
                        f"cannot reach the host of channel {self._name!r} ({host.info.describe()}): {exc}; "
                        f"its process may have died",
                        peer=self._group + ":0",
                    ) from None
                _clients[self._name] = client
            return client

    def _call(self, ctrl: dict, frames=(), async_op: bool = False, timeout: Optional[float] = None, decode=None):
        client = self._client()
        rid, fut = client.request(ctrl, frames)
        what = f"{ctrl['op']} on channel {self._name!r} key {ctrl.get('key', DEFAULT_KEY)!r}"

        def finish(reply):
            ctrl_back, items = reply
            _raise_for(ctrl_back, what, client.host)
            return decode(ctrl_back, items) if decode else ctrl_back.get("value")

        if async_op:
            from ..p2p.async_work import AsyncWork

            return AsyncWork(fut, what).then(finish)
        wait = None if timeout is None else timeout + REPLY_GRACE
        try:
            reply = fut.result(wait)
        except concurrent.futures.TimeoutError:
            client.cancel(rid)
            raise CommTimeoutError(f"{what} got no reply from its host within {wait:g} s", peer=client.host) from None
        return finish(reply)

    # -- producer side ------------------------------------------------------------
    def put(self, item: Any, weight: float = 0, key: str = DEFAULT_KEY, async_op: bool = False, timeout: Optional[float] = None):
        """Append ``item`` to ``key``'s queue, waiting for room when the channel is bounded."""
        from ..p2p import codec

        header, buffers = codec.encode(item)
        timeout = None if async_op and timeout is None else config.resolve_timeout(timeout)
        ctrl = {"op": "put", "key": _check_key(key), "weight": float(weight), "timeout": timeout}
        result = self._call(ctrl, [header, *buffers], async_op, timeout)
        return result if async_op else None

    def put_nowait(self, item: Any, weight: float = 0, key: str = DEFAULT_KEY) -> None:
        """Append or raise ``asyncio.QueueFull`` at once."""
        from ..p2p import codec

        header, buffers = codec.encode(item)
        self._call({"op": "put", "key": _check_key(key), "weight": float(weight), "nowait": True}, [header, *buffers])

    # -- consumer side --------------------------------------------------------------
    def get(self, key: str = DEFAULT_KEY, async_op: bool = False, timeout: Optional[float] = None):
        """Remove and return the oldest item of ``key``'s queue, waiting for one."""
        timeout = None if async_op and timeout is None else config.resolve_timeout(timeout)
        return self._call({"op": "get", "key": _check_key(key), "timeout": timeout}, (), async_op, timeout, _decode_one)

    def get_nowait(self, key: str = DEFAULT_KEY):
        """Remove and return the oldest item, or raise ``asyncio.QueueEmpty`` at once."""
        return self._call({"op": "get", "key": _check_key(key), "nowait": True}, (), False, None, _decode_one)

    def get_batch(self, target_weight: float, key: str = DEFAULT_KEY, async_op: bool = False, timeout: Optional[float] = None):
        """The longest FIFO prefix of ``key``'s queue whose weights sum to at most ``target_weight``.

        Waits until that prefix can grow no further: it reaches the target, or
        the next queued item would exceed it.
        """
        if isinstance(target_weight, bool) or not isinstance(target_weight, (int, float)) or target_weight <= 0:
            raise ValueError(f"target_weight must be a positive number, got {target_weight!r}")
        timeout = None if async_op and timeout is None else config.resolve_timeout(timeout)
        ctrl = {"op": "get_batch", "key": _check_key(key), "target": float(target_weight), "timeout": timeout}
        return self._call(ctrl, (), async_op, timeout, _decode_many)

    def qsize(self, key: str = DEFAULT_KEY) -> int:
        return self._call({"op": "qsize", "key": _check_key(key)}, timeout=config.default_timeout())

    def empty(self, key: str = DEFAULT_KEY) -> bool:
        return self.qsize(key) == 0

    def full(self, key: str = DEFAULT_KEY) -> bool:
        return self._call({"op": "full", "key": _check_key(key)}, timeout=config.default_timeout())


def _raise_for(ctrl: dict, what: str, host: str) -> None:
    error = ctrl.get("error")
    if not error:
        return
    message = ctrl.get("message", "")
    if error == "QueueFull":
        raise asyncio.QueueFull(message)
    if error == "QueueEmpty":
        raise asyncio.QueueEmpty(message)
    if error == "Timeout":
        raise CommTimeoutError(f"{what}: {message}", peer=host)
    if error == "ValueError":
        raise ValueError(message)
    raise CommunicationError(f"{what} failed in the channel host {host}: {message}\n\nRemote traceback:\n{ctrl.get('traceback', '')}", peer=host)


def _split(ctrl: dict, frames: list) -> list:
    out, pos = [], 0
    for n in ctrl.get("sizes", []):
        out.append(frames[pos : pos + n])
        pos += n
    return out


def _decode_one(ctrl: dict, frames: list):
    from ..p2p import codec

    item = _split(ctrl, frames)[0]
    return codec.decode(item[0], item[1:])


def _decode_many(ctrl: dict, frames: list) -> list:
    from ..p2p import codec

    return [codec.decode(item[0], item[1:]) for item in _split(ctrl, frames)]


def forget_process_channels() -> None:
    """Close this process's channel connections and forget the channels it created."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
        _hosts.clear()
    for client in clients:
        try:
            client.close()
        except Exception:
            pass


def create_channel_from_worker(name, node_id, maxsize, aliases) -> Channel:
    name = aliases.pop("channel_name", name)
    node_id = aliases.pop("node_rank", node_id)
    if aliases:
        raise TypeError(f"create_channel() got unexpected keyword arguments {sorted(aliases)}")
    if name is None:
        raise TypeError("create_channel() needs a channel name")
    return Channel.create(name, maxsize=maxsize, node_id=0 if node_id is None else node_id)
