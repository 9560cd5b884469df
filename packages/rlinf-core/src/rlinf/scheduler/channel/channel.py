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
from typing import Any, Hashable, Optional

from ..base import config, lifecycle
from ..base.address import CHANNEL_HOST_PREFIX, validate_group_name
from ..runtime.cluster import Cluster
from ..plugins.launcher import current_session
from ..plugins.placement import NodePlacementStrategy
from ..base.errors import CommTimeoutError, CommunicationError, GroupNameError, PeerDiedError
from ..base.hooks import hook
from ..worker import Worker
from ..worker.worker import provide_channels
from ..messaging.channel.keys import OpLabel, key_token, replica_of
from ..messaging.channel.client import ChannelClient
from ..messaging.channel.feeding import FEED_WINDOW
from ..messaging.channel.protocol import REPLY_GRACE, SendTimeout
from ..messaging.channel.protocol import send_timeout as _send_timeout
from ..transports import codec
from ..transports.async_work import AsyncWork
from .works import _BatchedPutWork, _PutWork, _TakeWork

DEFAULT_KEY = "default_queue"
_GROUP_PREFIX = CHANNEL_HOST_PREFIX
#: seconds connect() waits for a channel that another process is creating
CONNECT_WAIT = 10.0
#: seconds a ``*_nowait`` call may spend handing its request to the transport
NOWAIT_SEND = 1.0
#: a put of fewer bytes than this on a channel without maxsize goes as a one-way push; larger ones
#: wait for the host's answer, which paces a producer of large items to what the host takes in
PUSH_MAX = 1 << 16


class ChannelHostWorker(Worker):
    """The worker that hosts one channel's queues."""

    def __init__(self, channel_name: str, maxsize: int):
        super().__init__()
        from ..runtime import status_server
        from ..messaging.p2p.communicator import local_communicator
        from ..messaging.channel.server import ChannelServer

        self._server = ChannelServer(channel_name, maxsize)
        local_communicator(create=True).add_service("channel", self._server.on_connect)
        status_server.add_section("channel", self._server.describe)  # python -m rlinf.scheduler status

    def ping(self) -> bool:
        return True

    def stats(self, detail: bool = False) -> dict:
        """Live bookkeeping: keys with state, items queued, clients connected, replies not yet acknowledged;
        with ``detail``, each key's queued items and parked getters and putters (``ChannelServer.snapshot``)."""
        return self._server.stats(detail)


def _group_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a channel name must be a non-empty str, got {name!r}")
    return validate_group_name(_GROUP_PREFIX + name)


def _check_maxsize(maxsize) -> int:
    if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 0:
        raise ValueError(f"maxsize must be an int >= 0 (0: unbounded), got {maxsize!r}")
    return maxsize


def _check_key(key) -> str:
    if key == "":
        raise TypeError("a channel key must not be the empty string")
    return key_token(key)


_hosts: dict[str, Any] = {}  # channel name -> host group launched by this process (keeps the actor alive)
_clients: dict[tuple, ChannelClient] = {}  # (channel name, replica) -> this process's connection
_replica_counts: dict[str, int] = {}
_local: dict[str, Any] = {}  # channel name -> LocalChannel of this process
_lock = threading.Lock()


class Channel:
    """A named, bounded FIFO channel shared by the driver and every worker.

    Each key of a channel is its own FIFO queue; items carry a weight that
    ``get_batch`` sums.  A ``Channel`` object is a handle: it pickles to its
    name and works in any process of the cluster.  Make one with
    ``Channel.create`` (or ``Worker.create_channel``) and reach an existing
    one with ``Channel.connect``.

    Args:
        name: the channel's name.
        maxsize: the bound of each key's queue (0: unbounded).

    Example:
        ```python
        channel = Channel.create("rollouts", maxsize=64)
        channel.put({"obs": obs}, weight=1, key="env0")
        batch = channel.get_batch(target_weight=8, key="env0")
        ```
    """

    def __init__(self, name: str, maxsize: int = 0):
        self._name = name
        self._group = _group_name(name)
        self._maxsize = maxsize

    # -- creation ---------------------------------------------------------------
    @classmethod
    def create(cls, name: str, maxsize: int = 0, node_id: int = 0, cluster=None, *, distributed: bool = False,
               local: bool = False):
        """Create the channel on node ``node_id``, or connect to it if it exists.

        Args:
            name: the channel's name, unique in the cluster.
            maxsize: the most items each key's queue holds (0: unbounded).
            node_id: the node whose host process holds the items.
            cluster (Cluster | None): the ``Cluster`` to launch the host on (default: ``Cluster()``).
            distributed: one host per node of the cluster; each key lives on one
                of them, chosen by a hash of the key that every process computes
                alike, so each key stays one FIFO queue while the keys spread over
                the nodes.
            local: an in-process channel for this process only (RLinf's local
                channel; see ``channel.local``).

        Returns the channel (a ``LocalChannel`` with ``local=True``).

        Raises:
            ValueError: a bad ``name``, ``maxsize`` or ``node_id``, or both ``local`` and ``distributed``.
            CommunicationError: another process is creating the channel and did not finish in time.
        """
        group = _group_name(name)
        maxsize = _check_maxsize(maxsize)
        if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id < 0:
            raise ValueError(f"node_id must be an int >= 0, got {node_id!r}")
        if local and distributed:
            raise ValueError("a channel cannot be both local=True and distributed=True")
        if local:
            from ..messaging.channel.local import LocalChannel

            with _lock:
                if name not in _local:
                    _local[name] = LocalChannel(name, maxsize)
                    _local[name].is_local = True  # RLinf's ``Channel.is_local``
                return _local[name]
        cluster = cluster or Cluster()
        deadline = time.monotonic() + config.launch_timeout()
        while True:
            stale: list = []
            try:
                with _lock:
                    host = _hosts.get(name)
                    if host is not None and host._running():
                        return cls(name, maxsize)
                    if _hosts.pop(name, None) is not None:  # a host this process stopped is launched afresh
                        _replica_counts.pop(name, None)
                        stale = [_clients.pop(slot) for slot in [s for s in _clients if s[0] == name]]
                    try:
                        nodes = [n.node_rank for n in cluster.nodes] if distributed else [node_id]
                        _hosts[name] = ChannelHostWorker.create_group(name, maxsize).launch(
                            cluster, placement_strategy=NodePlacementStrategy(nodes), name=group
                        )
                        return cls(name, maxsize)
                    except GroupNameError:
                        pass  # another process holds the name: it runs the host, or is launching it
            finally:
                for client in stale:  # the old host's connections, closed outside the lock (their callbacks run)
                    client.close(grace=0)
            # lost the race: connect once the winner's host is registered; if the winner's launch
            # failed (the name is released again) the next round launches the host here
            if cluster.session.lookup_group(group) is not None:
                return cls(name, maxsize)
            if time.monotonic() >= deadline:
                raise CommunicationError(f"channel {name!r} is being created by another process, which did not "
                                         f"finish within {config.launch_timeout():g} s")
            time.sleep(0.1)

    @classmethod
    def connect(cls, name: str, timeout: float = CONNECT_WAIT) -> "Channel":
        """Connect to an existing channel, waiting for it to appear.

        Args:
            name: the channel's name.
            timeout: seconds to wait for a process to create it.

        Returns:
            The channel.

        Raises:
            ValueError: ``name`` is not a valid channel name, or ``timeout`` not positive.
            CommunicationError: no channel of that name appeared within ``timeout``.
        """
        timeout = config.check_timeout(timeout) or CONNECT_WAIT
        group = _group_name(name)
        if name in _local:
            return _local[name]
        session = current_session()
        deadline = time.monotonic() + timeout
        pause = 0.05  # doubles up to a second: a long wait costs the registry a lookup a second, not twenty
        while True:
            record = session.lookup_group(group)
            if record is not None:
                return cls(name)
            left = deadline - time.monotonic()
            if left <= 0:
                raise CommunicationError(f"no channel named {name!r} exists (create it with create_channel / Channel.create)")
            time.sleep(min(pause, left))
            pause = min(1.0, pause * 2)

    def __reduce__(self):
        return (Channel, (self._name, self._maxsize))

    @property
    def name(self) -> str:
        """The channel's name."""
        return self._name

    #: RLinf's ``Channel.is_local``: False here; a ``local=True`` channel (an in-process one) says True
    is_local = False

    def __repr__(self) -> str:
        return f"Channel({self._name!r})"

    # -- plumbing -----------------------------------------------------------------
    def _replicas(self) -> int:
        """How many hosts serve this channel (one per node for ``distributed=True``)."""
        n = _replica_counts.get(self._name)
        if n is None:
            record = current_session().lookup_group(self._group)
            if record is None:
                raise CommunicationError(f"channel {self._name!r} no longer exists (its host stopped)")
            n = _replica_counts[self._name] = len(record.workers)
        return n

    def _client(self, replica: int = 0) -> ChannelClient:
        slot = (self._name, replica)
        client = _clients.get(slot)
        if client is not None and client._dead is None:
            return client
        with _lock:
            client = _clients.get(slot)
            if client is None or client._dead is not None:
                record = current_session().lookup_group(self._group)
                if record is None:
                    raise CommunicationError(f"channel {self._name!r} no longer exists (its host stopped)")
                host = record.workers[replica]
                try:
                    client = ChannelClient.connect(self._name, f"{self._group}:{replica}", host)
                except OSError as exc:
                    raise PeerDiedError(
                        f"cannot reach the host of channel {self._name!r} ({host.info.describe()}): {exc}; "
                        f"its process may have died",
                        peer=f"{self._group}:{replica}",
                    ) from None
                _clients[slot] = client
            return client

    def _call(self, ctrl: dict, frames=(), async_op: bool = False, timeout: Optional[float] = None, decode=None,
              send_timeout: Optional[float] = None):
        client = self._client(replica_of(ctrl.get("key", DEFAULT_KEY), self._replicas()))
        what = OpLabel(ctrl["op"], self._name, ctrl.get("key", DEFAULT_KEY))

        def finish(reply):
            ctrl_back, items = reply
            if ctrl_back.get("unbounded"):
                client.unbounded = True  # the next puts go as pushes
            if "count" in ctrl_back:
                # acknowledged before the user has the items, so no way the process ends redelivers them
                # (nor one that fails to decode: never redeliver poison); PeerDiedError if it cannot be sent
                client.ack(rid)
            _raise_for(ctrl_back, what, client.host)
            return decode(ctrl_back, items) if decode else ctrl_back.get("value")

        if ctrl["op"] == "get" and not async_op:
            start = time.monotonic()
            got = _take_fed(client, ctrl, timeout, what)
            if got is not _NOT_FED:
                return got
            if timeout is not None and ctrl.get("timeout") is not None:  # a feed that ended mid-wait: what is left
                timeout = ctrl["timeout"] = max(0.0, timeout - (time.monotonic() - start))
        elif ctrl["op"] in ("get", "get_batch") and client.has_feed(ctrl["key"]):
            client.end_feed(ctrl["key"])  # its items go back to the head of the queue before this take
        try:
            if ctrl["op"] == "put" and client.unbounded and not client._open_puts and not ctrl.get("nowait"):
                size = _push_size(frames)
                if size >= 0 and async_op:  # now, or with the pushes of its burst (see ChannelClient.push_async)
                    batch = client.push_async(ctrl, frames, size, send_timeout)
                    return _done(what) if batch is None else _BatchedPutWork(batch, what, client)
                if size >= 0:
                    client.push(ctrl, frames, send_timeout)  # returned: it happened (see ChannelClient.push)
                    return None
            rid, fut = client.request(ctrl, frames, send_timeout, blocking=not async_op)
        except SendTimeout as exc:
            if ctrl.get("nowait") and not exc.busy:
                raise asyncio.QueueFull(f"{what}: the host is not taking items ({exc})") from None
            raise CommTimeoutError(f"{what}: {exc}", peer=client.host) from None
        if async_op:
            if ctrl["op"] in ("get", "get_batch"):
                return _TakeWork(fut, what, finish, client, rid)
            if ctrl["op"] == "put":
                return _PutWork(fut, what, finish, client)
            return AsyncWork(fut, what).then(finish)
        # bounded: a sync operation always carries a timeout, and the host answers (or is declared dead) before this
        wait = (_send_timeout() if timeout is None else timeout) + REPLY_GRACE
        try:
            reply = client.wait_reply(fut, wait)
        except concurrent.futures.TimeoutError:
            client.cancel(rid)
            raise CommTimeoutError(f"{what} got no reply from its host within {wait:g} s", peer=client.host) from None
        except BaseException:
            client.cancel(rid)  # interrupted: the host must not keep an item for a caller that left
            raise
        return finish(reply)

    # -- producer side ------------------------------------------------------------
    @hook("channel")
    def put(self, item: Any, weight: float = 0, key: Hashable = DEFAULT_KEY, async_op: bool = False, timeout: Optional[float] = None):
        """Append ``item`` to ``key``'s queue, waiting for room when the channel is bounded.

        Args:
            item: any picklable object (tensors travel as raw bytes).
            weight: what the item counts for in ``get_batch``.
            key: the queue to append to: any hashable value, with the rules of a dict key
                (each key is its own FIFO; ``("a", 1)`` is the same queue in every process).
            async_op: return an ``AsyncWork`` instead of waiting for the host (a put that starts a
                route to the consumer waits for the host's answer, bounded as a synchronous put's is,
                and one on a route whose consumer has not taken the last 64 items waits 20 ms at most).
            timeout: seconds to wait; ``None``: the configured default
                (``RLINF_TIMEOUT``; with ``async_op``, the work's ``wait`` bounds it:
                a ``wait(t)`` on that work that runs out withdraws the put, which
                then raises ``CommTimeoutError`` and is never delivered; a wait on
                ``then(...)`` of it, ``gather`` or ``asyncio.wait_for`` only stops
                waiting, and the put may still be delivered).

        Returns ``None``, or with ``async_op`` an ``AsyncWork`` done once the item is queued.

        Raises:
            UnpicklableError: ``item`` cannot be pickled.
            TypeError: ``key`` is the empty string.
            CommTimeoutError: the channel's host did not answer within ``timeout``.
            CommunicationError: the host failed or cannot be reached.
        """
        header, buffers = codec.encode(item, what=lambda: f"the item put on channel {self._name!r} (key {key!r})", root="item")
        timeout = None if async_op and timeout is None else config.resolve_timeout(timeout)
        ctrl = {"op": "put", "key": _check_key(key), "weight": float(weight), "timeout": timeout}
        result = self._call(ctrl, [header, *buffers], async_op, timeout, send_timeout=timeout)
        return result if async_op else None

    @hook("channel")
    def put_nowait(self, item: Any, weight: float = 0, key: Hashable = DEFAULT_KEY) -> None:
        """Append ``item`` to ``key``'s queue, or raise at once if it is full.

        Args:
            item: any picklable object.
            weight: what the item counts for in ``get_batch``.
            key: the queue to append to.

        Raises:
            asyncio.QueueFull: the queue is full (or its host is not taking items).
            UnpicklableError: ``item`` cannot be pickled.
            CommTimeoutError: the channel's host did not answer within ``timeout``.
            CommunicationError: the host failed or cannot be reached.
        """
        header, buffers = codec.encode(item, what=lambda: f"the item put on channel {self._name!r} (key {key!r})", root="item")
        self._call({"op": "put", "key": _check_key(key), "weight": float(weight), "nowait": True}, [header, *buffers],
                   timeout=NOWAIT_SEND, send_timeout=NOWAIT_SEND)

    # -- consumer side --------------------------------------------------------------
    @hook("channel")
    def get(self, key: Hashable = DEFAULT_KEY, async_op: bool = False, timeout: Optional[float] = None):
        """Remove and return the oldest item of ``key``'s queue, waiting for one.

        Args:
            key: the queue to take from.
            async_op: return an ``AsyncWork`` at once instead of waiting.
            timeout: seconds to wait; ``None``: the configured default
                (``RLINF_TIMEOUT``; with ``async_op``, the work's ``wait`` bounds it).

        Returns the item, or with ``async_op`` an ``AsyncWork`` whose ``wait()`` returns it.

        Raises:
            TypeError: ``key`` is the empty string.
            CommTimeoutError: the channel's host did not answer within ``timeout``.
            CommunicationError: the host failed or cannot be reached.
        """
        timeout = None if async_op and timeout is None else config.resolve_timeout(timeout)
        return self._call({"op": "get", "key": _check_key(key), "timeout": timeout}, (), async_op, timeout, _decode_one)

    @hook("channel")
    def get_nowait(self, key: Hashable = DEFAULT_KEY):
        """Remove and return the oldest item of ``key``'s queue, or raise at once.

        Args:
            key: the queue to take from.

        Raises:
            asyncio.QueueEmpty: the queue is empty.
            CommTimeoutError: the channel's host did not answer within ``timeout``.
            CommunicationError: the host failed or cannot be reached.
        """
        return self._call({"op": "get", "key": _check_key(key), "nowait": True}, (), False, NOWAIT_SEND, _decode_one)

    @hook("channel")
    def get_batch(self, target_weight: float, key: Hashable = DEFAULT_KEY, async_op: bool = False, timeout: Optional[float] = None):
        """The longest FIFO prefix of ``key``'s queue whose weights sum to at most ``target_weight``.

        Waits until that prefix can grow no further: it reaches the target, or
        the next queued item would exceed it.

        Args:
            target_weight: the most the taken items' weights may sum to (> 0).
            key: the queue to take from.
            async_op: return an ``AsyncWork`` at once instead of waiting.
            timeout: seconds to wait; ``None``: the configured default
                (``RLINF_TIMEOUT``; with ``async_op``, the work's ``wait`` bounds it).

        Returns the list of items, head first, or with ``async_op`` an ``AsyncWork``.

        Raises:
            ValueError: ``target_weight`` is not a positive number.
            CommTimeoutError: the channel's host did not answer within ``timeout``.
            CommunicationError: the host failed or cannot be reached.
        """
        if isinstance(target_weight, bool) or not isinstance(target_weight, (int, float)) or target_weight <= 0:
            raise ValueError(f"target_weight must be a positive number, got {target_weight!r}")
        timeout = None if async_op and timeout is None else config.resolve_timeout(timeout)
        ctrl = {"op": "get_batch", "key": _check_key(key), "target": float(target_weight), "timeout": timeout}
        return self._call(ctrl, (), async_op, timeout, _decode_many)

    def qsize(self, key: Hashable = DEFAULT_KEY) -> int:
        """How many items ``key``'s queue holds now.

        Args:
            key: the queue to count.

        Raises:
            CommTimeoutError: the channel's host did not answer within ``timeout``.
            CommunicationError: the host failed or cannot be reached.
        """
        return self._call({"op": "qsize", "key": _check_key(key)}, timeout=config.default_timeout())

    def empty(self, key: Hashable = DEFAULT_KEY) -> bool:
        """Whether ``key``'s queue holds no item now.

        Args:
            key: the queue to look at.

        Raises:
            CommTimeoutError: the channel's host did not answer within ``timeout``.
            CommunicationError: the host failed or cannot be reached.
        """
        return self.qsize(key) == 0

    def full(self, key: Hashable = DEFAULT_KEY) -> bool:
        """Whether ``key``'s queue is at the channel's ``maxsize`` now (never for an unbounded channel).

        Args:
            key: the queue to look at.

        Raises:
            CommTimeoutError: the channel's host did not answer within ``timeout``.
            CommunicationError: the host failed or cannot be reached.
        """
        return self._call({"op": "full", "key": _check_key(key)}, timeout=config.default_timeout())


_NOT_FED = object()


def _take_fed(client: ChannelClient, ctrl: dict, timeout: Optional[float], what: str):
    """A blocking get served from the items its connection was fed ahead (see ``feeding``), or
    ``_NOT_FED``: the host is asked (for a feed too, unless it is a ``get_nowait``)."""
    key, nowait = ctrl["key"], ctrl.get("nowait")
    if client.has_feed(key):
        wait = 0.0 if nowait else _send_timeout() if timeout is None else timeout
        try:
            got = client.take_fed(key, time.monotonic() + wait)
        except TimeoutError:
            if not nowait:
                raise CommTimeoutError(f"{what}: timed out waiting", peer=client.host) from None
            client.end_feed(key)  # the host answers, once the items on their way here are back
            return _NOT_FED
        if got is not None:
            rid, frames = got
            try:
                client.ack(rid)  # before the user has it, as for any get
            except BaseException:
                client.give_back(key, rid, frames)
                raise
            return codec.decode(frames[0], frames[1:])
    if not nowait:
        ctrl["feed"] = FEED_WINDOW
        direct = client._direct_offer()
        if direct:
            ctrl["direct"] = direct  # producers may send here straight (see ``messaging.channel.routes``)
    return _NOT_FED


def _push_size(frames) -> int:
    """The bytes of a put's frames if it is small enough to go as a push, else -1."""
    total = 0
    for f in frames:
        total += f.nbytes if isinstance(f, memoryview) else len(f) if isinstance(f, (bytes, bytearray)) else memoryview(f).nbytes
        if total >= PUSH_MAX:
            return -1
    return total


_DONE: concurrent.futures.Future = concurrent.futures.Future()
_DONE.set_result(None)  # shared: a finished future is never changed (a callback added to it runs at once)


def _done(what: str):
    """The ``AsyncWork`` of an asynchronous put already made (a push)."""
    return AsyncWork(_DONE, what)


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
    item = _split(ctrl, frames)[0]
    return codec.decode(item[0], item[1:])


def _decode_many(ctrl: dict, frames: list) -> list:
    return [codec.decode(item[0], item[1:]) for item in _split(ctrl, frames)]


@lifecycle.on_release
def forget_process_channels() -> None:
    """Close this process's channel connections and forget the channels it created."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
        _hosts.clear()
        _replica_counts.clear()
        _local.clear()
    for client in clients:
        try:
            client.close(grace=0.5)  # its host may already be stopping
        except Exception:
            pass


def create_channel_from_worker(name, node_id, maxsize, aliases) -> Channel:
    name = aliases.pop("channel_name", name)
    node_id = aliases.pop("node_rank", node_id)
    local = aliases.pop("local", False)
    distributed = aliases.pop("distributed", False)
    if aliases:
        raise TypeError(f"create_channel() got unexpected keyword arguments {sorted(aliases)}")
    if name is None:
        raise TypeError("create_channel() needs a channel name")
    return Channel.create(name, maxsize=maxsize, node_id=0 if node_id is None else node_id,
                          local=local, distributed=distributed)


provide_channels(create_channel_from_worker, Channel.connect)
