"""RLinf's routed exchange on ``Worker``: ``send_to`` and ``recv_from``.

A *routed* exchange moves one logical batch between two worker groups of any
sizes: each sender cuts its part into the shards its route plan lists
(``routing.build_send_plan`` / ``decoupled_build_send_plan``), each shard travels
under the plan's channel key (``channel.put``/``get``) or, with
``enable_p2p=True``, point to point to the plan's peer rank (``send``/``recv``),
and each receiver takes the shards its plan lists, checks their sizes and
merges them (``batching.merge_batches``).  The plans, keys, messages and
errors are RLinf 0.3.0's; ``docs/architecture.md`` ("A routed exchange") walks
through one.

Differences from RLinf 0.3.0, none of which a program that works there notices:

* every failure names the method, this worker (group, rank, node) and the peer
  group, followed by RLinf's own message;
* bad input is refused before anything is sent or recorded: ``split_fn``'s
  shards are counted (and made) before ``batch_router`` is cleared and before
  the first shard leaves;
* the peer group's size is asked of the cluster at most once a second
  (``GROUP_SIZE_TTL``) per process, not at every call; RLinf asks its manager
  every time.  A worker with an RLinf manager proxy (``_manager_proxy``) asks it
  every time, as RLinf does;
* a ``timeout`` keyword bounds each shard's operation (default: the
  configured ``RLINF_TIMEOUT``), asynchronous ones included.
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..base import config
from ..collective.async_work import AsyncRouteWork
from .batching import BatchSplitError
from .routing import (
    RouteSizeError,
    build_recv_plan,
    build_send_plan,
    decoupled_build_recv_plan,
    decoupled_build_send_plan,
    get_group_world_size,
    infer_batch_size,
    merge_batches,
    split_batch,
    split_channel_message,
    validate_batch_size,
)

if TYPE_CHECKING:
    from ..plugins.options import CollectiveGroupOptions

#: seconds a process keeps a peer group's size before asking the cluster again
GROUP_SIZE_TTL = 1.0

_group_sizes: dict[str, tuple[int, float]] = {}  # group name -> (world size, when it was asked)

_P2P_DECOUPLED = "Now, enable_p2p dpn't support when decoupled_mode is True."  # RLinf's text, as it is
_NO_ROUTER = "batch_router must be provided when decoupled_mode is True."


@contextlib.contextmanager
def _named(where: Callable[[], str]):
    """Re-raise the routing and batching errors of the block with the caller named before their message."""
    try:
        yield
    except (RouteSizeError, BatchSplitError, ValueError) as exc:
        if type(exc) not in (RouteSizeError, BatchSplitError, ValueError):
            raise  # a subclass of the user's: its constructor may take other arguments
        raise type(exc)(f"{where()}: {exc}") from None


class RoutedExchange:
    """Mixin of ``Worker``: routed sends and receives between groups (``send_to``, ``recv_from``).

    A worker that takes part in decoupled exchanges sets ``self.batch_router``, a
    dict from tag to a list: a receive whose shards carry a tag in it records
    their route messages there, and a later ``send_to`` with that tag sends its
    answer back along them.
    """

    # -- helpers ----------------------------------------------------------------------------------
    def _route_where(self, method: str, group_name: str) -> str:
        """``"send_to from group 'env' rank 0 (node 0) to group 'rollout'"``: who failed, for messages."""
        info = getattr(self, "_worker_info", None)
        node = f" (node {info.node_id})" if info is not None else ""
        me = self.worker_address.root_group_name
        way = "to" if method == "send_to" else "from"
        return f"{method} {way} group {group_name!r}, in group {me!r} rank {self._rank}{node}"

    def _route_peer_size(self, group_name: str) -> int:
        """The size of group ``group_name``: this group's own, RLinf's manager proxy's answer, or the
        cluster's (kept ``GROUP_SIZE_TTL`` seconds)."""
        if group_name == self.worker_address.root_group_name:
            return self._world_size
        if self._manager_proxy is not None:
            return get_group_world_size(self._manager_proxy, group_name)
        now = time.monotonic()
        hit = _group_sizes.get(group_name)
        if hit is not None and now - hit[1] < GROUP_SIZE_TTL:
            return hit[0]
        size = get_group_world_size(None, group_name)
        _group_sizes[group_name] = (size, now)
        return size

    def _route_check(self, method: str, group_name: str, channel: Any, enable_p2p: bool,
                     decoupled_mode: bool) -> None:
        """RLinf's checks of the transport and mode, with the caller named."""
        if decoupled_mode:
            if enable_p2p:
                raise AssertionError(f"{self._route_where(method, group_name)}: {_P2P_DECOUPLED}")
            if getattr(self, "batch_router", None) is None:
                raise AssertionError(f"{self._route_where(method, group_name)}: {_NO_ROUTER}")
        if not enable_p2p and channel is None:
            raise ValueError(f"{self._route_where(method, group_name)}: "
                             f"{method} requires ``channel`` when enable_p2p is False.")

    def _route_shards(self, group_name, data, route_key, mode, tag, batch_size, split_fn, decoupled_mode,
                      send_queue_size, where):
        """``send_to``'s plan, its shards, and the recorded routes it answers along (``None``: a request)."""
        me = self.worker_address.root_group_name
        world_size = self._route_peer_size(group_name)
        if batch_size is None:
            batch_size = infer_batch_size(data) * self._world_size
        recorded = None
        if not decoupled_mode:
            plan = build_send_plan(
                src_group_name=me, dst_group_name=group_name, src_rank=self._rank,
                src_world_size=self._world_size, dst_world_size=world_size,
                tag=tag if mode is None else f"{mode}_{tag}", route_key=route_key, batch_size=batch_size,
            )
        else:
            # an answer goes back along the routes recv_from recorded under this tag; a request carries
            # this rank in its messages, so that whoever takes it can answer
            recorded = self.batch_router[tag] if tag in self.batch_router else None
            plan = decoupled_build_send_plan(
                src_group_name=me, dst_group_name=group_name, src_rank=None if recorded is not None else self._rank,
                src_world_size=self._world_size, dst_world_size=world_size, tag=tag, route_key=route_key,
                batch_size=batch_size, tag_batch_router=recorded, send_queue_size=send_queue_size, mode=mode,
            )
        sizes = [entry.batch_size for entry in plan.entries]
        payloads = list(split_fn(data, sizes) if split_fn is not None else split_batch(data, sizes))
        if len(payloads) != len(sizes):
            raise ValueError(f"split_fn made {len(payloads)} shard(s) of a plan of {len(sizes)} ({sizes})")
        return plan, payloads, recorded

    # -- send -------------------------------------------------------------------------------------
    def send_to(
        self,
        group_name: str,
        channel: Any | None,
        data: Any,
        *,
        route_key: Any = None,
        mode: str | None = None,
        tag: str | None = None,
        async_op: bool = False,
        batch_size: int | None = None,
        split_fn: Optional[Callable[[Any, list[int]], list[Any]]] = None,
        enable_p2p: bool = False,
        options: Optional["CollectiveGroupOptions"] = None,
        decoupled_mode: bool = False,
        send_queue_size: int = 0,
        timeout: Optional[float] = None,
    ):
        """Send this rank's part of a batch to group ``group_name``, cut into the shards its route plan lists.

        The whole batch, of ``batch_size`` items, is laid out over this group in
        rank order; this rank holds ``data``.  In normal mode each shard goes to the
        destination rank that holds its items there (``build_send_plan``): 2 ranks
        of 4 items to 1 rank send one shard each; 1 rank of 8 to 2 ranks sends two
        shards of 4.  The receivers call ``recv_from`` with the same tag, route key
        and batch size.

        In decoupled mode (``decoupled_mode=True``; the worker has ``self.batch_router``)
        each shard is sent as ``{"batch_index": message, "batch": shard}`` and any
        receiver may take it.  If ``tag`` is not in ``self.batch_router`` (a
        request), the message is ``"{rank}_{i}_{mode}_{tag}"`` and the shards go
        to any rank of ``group_name``.  If it is (an answer), the shards go back
        along the messages ``recv_from`` recorded there, shard ``i`` to the rank
        that sent the ``i``-th recorded shard, under the key of the tag that
        message names (its mode is not part of the key, as in RLinf), and the
        recorded messages are cleared.

        Tensors and arrays inside the shards travel as raw bytes, never pickled.

        Args:
            group_name: the destination group.
            channel: the ``Channel`` the shards go through; may be ``None`` with ``enable_p2p``.
            data: this rank's part of the batch (a tensor, array, list, dict or
                dataclass of them; see ``rlinf.scheduler.worker.batching``).
            route_key: a further key separating independent streams (a pipeline stage).
            mode: a phase name (``"train"``, ``"eval"``): in normal mode the key's tag
                becomes ``"{mode}_{tag}"``; in decoupled mode it is written into the messages.
            tag: the stream's tag (``None``: ``"default"``).
            async_op: return an ``AsyncRouteWork`` at once instead of waiting for every shard.
            batch_size: the whole batch's size; ``None``: the size of ``data`` times this group's size.
            split_fn: ``split_fn(data, sizes)`` cuts ``data`` into shards of ``sizes``
                items (``None``: ``split_batch``).
            enable_p2p: send the shards with ``Worker.send`` instead of the channel
                (normal mode only; the tag and route key then play no part).
            options: ``CollectiveGroupOptions`` for ``Worker.send`` (with ``enable_p2p``).
            decoupled_mode: route as described above.
            send_queue_size: in decoupled mode, when this group is the smaller, how many
                shards to send (0: ``dst_world_size // src_world_size``).
            timeout: seconds each shard's operation may take (``None``: the configured
                ``RLINF_TIMEOUT``).  Not in RLinf.

        Returns:
            ``None`` once every shard is queued (channel) or sent (p2p); with
            ``async_op``, an ``AsyncRouteWork`` whose ``wait()`` returns ``None`` then.

        Raises:
            AssertionError: ``decoupled_mode`` with ``enable_p2p``, or without
                ``self.batch_router`` (RLinf's assertions).
            ValueError: no ``channel`` without ``enable_p2p``; ``data`` cannot be
                split or sized; ``split_fn`` made a different number of shards.
            RouteSizeError: ``batch_size`` not divisible by a group's size (a
                ``ValueError`` and an ``AssertionError``).
            BatchSplitError: ``data`` does not hold the items the plan gives this
                rank (a ``ValueError`` and a ``RuntimeError``); nothing is sent.
            CommTimeoutError: a shard could not be queued or sent within ``timeout``.
            CommunicationError: the channel's host or a peer cannot be reached.
        """
        self._route_check("send_to", group_name, channel, enable_p2p, decoupled_mode)
        where = lambda: self._route_where("send_to", group_name)  # noqa: E731  (built only for an error)
        with _named(where):
            plan, payloads, recorded = self._route_shards(group_name, data, route_key, mode, tag, batch_size, split_fn,
                                                          decoupled_mode, send_queue_size, where)
        if recorded is not None:
            self.batch_router[tag] = []  # used: an answer is sent once

        op_timeout = config.resolve_timeout(timeout)
        works = []
        for entry, payload in zip(plan.entries, payloads):
            if decoupled_mode:
                work = channel.put({"batch_index": entry.batch_index, "batch": payload}, key=entry.key,
                                   async_op=async_op, timeout=op_timeout)
            elif enable_p2p:
                work = self.send(payload, dst_group_name=group_name, dst_rank=entry.peer_rank, async_op=async_op,
                                 options=options, timeout=op_timeout)
            else:
                work = channel.put(payload, key=entry.key, async_op=async_op, timeout=op_timeout)
            if async_op and work is not None:
                works.append(work)
        if async_op:
            return AsyncRouteWork(works, lambda _results: None)
        return None

    def _route_recv_plan(self, group_name, route_key, tag, batch_size, decoupled_mode, recv_queue_size):
        """``recv_from``'s plan."""
        me = self.worker_address.root_group_name
        world_size = self._route_peer_size(group_name)
        if not decoupled_mode:
            plan = build_recv_plan(
                src_group_name=group_name, dst_group_name=me, dst_rank=self._rank,
                src_world_size=world_size, dst_world_size=self._world_size,
                tag=tag, route_key=route_key, batch_size=batch_size,
            )
        else:
            # a request (tag in batch_router) is taken by any rank; an answer is addressed to this one.
            # decoupled_build_recv_plan takes this group's size first: the smaller side takes several shards
            plan = decoupled_build_recv_plan(
                src_group_name=group_name, dst_group_name=me,
                recv_rank=None if tag in self.batch_router else self._rank,
                src_world_size=self._world_size, dst_world_size=world_size,
                tag=tag, route_key=route_key, batch_size=batch_size, recv_queue_size=recv_queue_size,
            )
        return plan

    # -- receive ----------------------------------------------------------------------------------
    def recv_from(
        self,
        group_name: str,
        channel: Any | None,
        *,
        route_key: Any = None,
        tag: str | None = None,
        async_op: bool = False,
        batch_size: int | None = None,
        merge_fn: Optional[Callable[[list[Any]], Any]] = None,
        infer_batch_size_fn: Optional[Callable[[Any], int]] = None,
        enable_p2p: bool = False,
        options: Optional["CollectiveGroupOptions"] = None,
        decoupled_mode: bool = False,
        recv_queue_size: int = 0,
        timeout: Optional[float] = None,
    ):
        """Receive this rank's part of a batch that group ``group_name`` sent with ``send_to``.

        In normal mode this rank takes one shard from each source rank that holds
        some of its items (``build_recv_plan``), in source-rank order, checks each
        shard's size against the plan and merges them.  The tag must be the
        sender's key tag (``"{mode}_{tag}"`` when the sender gave a ``mode``).

        In decoupled mode it takes its plan's number of shards under one key:
        any shard when ``tag`` is in ``self.batch_router`` (a request; the shards'
        messages are recorded in ``self.batch_router[message tag]`` for the answer),
        else the shards addressed to this rank (an answer; merged in the order of
        the indices their messages carry).

        Args:
            group_name: the source group.
            channel: the ``Channel`` the shards come through; may be ``None`` with ``enable_p2p``.
            route_key: the sender's route key.
            tag: the sender's key tag (``None``: ``"default"``).
            async_op: return an ``AsyncRouteWork`` at once; its ``wait()`` (or ``await``)
                returns what this method would.
            batch_size: the whole batch's size, as the sender gave or inferred it.
            merge_fn: ``merge_fn(shards)`` joins the shards (``None``: the one shard
                as it is, or ``merge_batches``).
            infer_batch_size_fn: ``fn(shard)`` gives a shard's size for the check
                (``None``: ``infer_batch_size``).
            enable_p2p: receive with ``Worker.recv`` from each source rank (normal mode only).
            options: ``CollectiveGroupOptions`` for ``Worker.recv`` (with ``enable_p2p``).
            decoupled_mode: route as described above.
            recv_queue_size: in decoupled mode, when this group is the smaller, how many
                shards to take (0: ``dst_world_size // src_world_size``).
            timeout: seconds each shard's operation may take (``None``: the configured
                ``RLINF_TIMEOUT``).  Not in RLinf.

        Returns:
            The merged shards; the one shard itself when there is one (and no
            ``merge_fn``); ``None`` when the plan lists none.  With ``async_op``, an
            ``AsyncRouteWork`` whose ``wait()`` returns that.

        Raises:
            AssertionError: ``decoupled_mode`` with ``enable_p2p``, or without
                ``self.batch_router`` (RLinf's assertions).
            ValueError: no ``channel`` without ``enable_p2p``; a shard whose size is not
                the plan's (``"Expected batch size 4, but received 3."``, as RLinf);
                in decoupled mode, an item that is not a routed shard.
            TypeError: ``batch_size`` is not an int.
            RouteSizeError: ``batch_size`` not divisible by a group's size.
            CommTimeoutError: a shard did not come within ``timeout``.
            CommunicationError: the channel's host or a peer cannot be reached.
        """
        self._route_check("recv_from", group_name, channel, enable_p2p, decoupled_mode)
        where = lambda: self._route_where("recv_from", group_name)  # noqa: E731
        if isinstance(batch_size, bool) or not isinstance(batch_size, int):
            raise TypeError(f"{where()}: batch_size must be the whole batch's size, an int, got {batch_size!r}")
        with _named(where):
            plan = self._route_recv_plan(group_name, route_key, tag, batch_size, decoupled_mode, recv_queue_size)

        def finalize(received: list) -> Any:
            if not received:
                return None
            if decoupled_mode:
                received = self._unwrap_decoupled(received, where)
            for index, (item, entry) in enumerate(zip(received, plan.entries)):
                try:
                    validate_batch_size(data=item, expected_batch_size=entry.batch_size,
                                        infer_batch_size_fn=infer_batch_size_fn)
                except ValueError as exc:
                    source = f"rank {entry.peer_rank}" if hasattr(entry, "peer_rank") else "its group"
                    raise ValueError(f"{where()}, shard {index} (from {source}): {exc}") from None
            if merge_fn is not None:
                return merge_fn(received)
            if len(received) == 1:
                return received[0]
            return merge_batches(received)

        op_timeout = config.resolve_timeout(timeout)
        if enable_p2p:
            got = [self.recv(src_group_name=group_name, src_rank=entry.peer_rank, async_op=async_op, options=options,
                             timeout=op_timeout) for entry in plan.entries]
        else:
            got = [channel.get(key=entry.key, async_op=async_op, timeout=op_timeout) for entry in plan.entries]
        if async_op:
            return AsyncRouteWork(got, finalize)
        return finalize(got)

    def _unwrap_decoupled(self, received: list, where: Callable[[], str]) -> list:
        """The shards of decoupled items, recording their messages (a request) or ordering them (an answer)."""
        for item in received:
            if not isinstance(item, dict) or "batch_index" not in item or "batch" not in item:
                raise ValueError(f"{where()}: expected a routed shard {{'batch_index': ..., 'batch': ...}} "
                                 f"(decoupled_mode=True), got {type(item).__name__}")
        _, _, _, message_tag = split_channel_message(received[0]["batch_index"])
        if message_tag in self.batch_router:
            for item in received:
                self.batch_router[message_tag].append(item["batch_index"])
            return [item["batch"] for item in received]
        indexed = sorted(((split_channel_message(item["batch_index"])[1], n) for n, item in enumerate(received)))
        return [received[n]["batch"] for _, n in indexed]
