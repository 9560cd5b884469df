"""Routing plans: which shard of a batch goes from which rank of one group to which rank of another.

RLinf's ``rlinf.scheduler.worker.routing``, same names, signatures and results.

**Coupled routing** (``build_send_plan`` / ``build_recv_plan``). A logical batch of
``batch_size`` items is laid out in rank order over the source group (each source
rank holds ``batch_size // src_world_size`` consecutive items) and must end laid out
in rank order over the destination group. Each source rank sends every destination
rank the items their ranges share, so 2 -> 4 ranks with 8 items sends rank 0's four
items as 2 + 2 to ranks 0 and 1, and 4 -> 2 sends ranks 0 and 1's two items each to
rank 0. Both world sizes must divide ``batch_size``. The plans of all senders and of
all receivers list the same shards, with the same channel keys.

**Decoupled routing** (``decoupled_build_send_plan`` / ``decoupled_build_recv_plan``).
Shards go to whichever destination worker takes them first: every shard holds
``batch_size // max(src_world_size, dst_world_size)`` items, and carries a *channel
message* ``"{send_rank}_{batch_idx}_{mode}_{tag}"`` naming where it came from so the
answer can be routed back (``split_channel_message``).

**Keys.** ``build_route_channel_key`` gives the channel key of one route, a tuple
``("scheduler_route", src_group, dst_group, tag or "default", route_key as str,
src_rank, dst_rank)``; ``CommMapper.build_channel_key`` gives the
``"{src}_{dst}_{extra}"`` strings of fixed rank pairs.

``GroupRouteBinding`` and ``balanced_group_id`` (which rollout rank serves which env
ranks) live in ``.route_binding`` and are re-exported here too.

The batch helpers (``split_batch``, ``merge_batches``, ...) live in ``.batching`` and
are re-exported here, where RLinf has them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..base.address import WorkerAddress
from ..base.info import WorkerInfo
from .batching import (
    BatchSplitError,
    get_batch_size,
    infer_batch_size,
    merge_batches,
    split_batch,
    validate_batch_size,
)
from .route_binding import GroupRouteBinding, balanced_group_id

ROUTING_KEY_PREFIX = "scheduler_route"
ROUTING_DEFAULT_TAG = "default"

__all__ = [
    "BatchSplitError", "CommMapper", "DecoupledRouteEntry", "GroupRouteBinding", "ROUTING_DEFAULT_TAG",
    "ROUTING_KEY_PREFIX", "RouteEntry", "RoutePlan", "RouteSizeError", "build_recv_plan",
    "balanced_group_id", "build_route_channel_key", "build_send_key", "build_send_plan", "decoupled_build_recv_plan",
    "decoupled_build_send_plan", "get_batch_size", "get_group_info", "get_group_world_size",
    "infer_batch_size", "merge_batches", "normalize_route_key", "normalize_route_tag",
    "split_batch", "split_channel_message", "validate_batch_size",
]


class RouteSizeError(ValueError, AssertionError):
    """Batch and world sizes that admit no plan (a size that does not divide, a rank out of range).

    RLinf checks these with ``assert``: this error is an ``AssertionError`` for code that
    catches that, and a ``ValueError``; unlike an ``assert`` it is raised under ``python -O`` too.
    """


# -- channel messages (decoupled routing) ---------------------------------------------------------
def _build_channel_message(send_rank: Optional[int], batch_idx: int, mode: Optional[str], tag: Optional[str]) -> str:
    """``"{send_rank}_{batch_idx}_{mode}_{tag}"``: where a decoupled shard came from (``None`` prints as ``None``)."""
    return f"{send_rank}_{batch_idx}_{mode}_{tag}"


def split_channel_message(channel_message: str) -> tuple[int, int, str, str]:
    """Split ``"{send_rank}_{batch_idx}_{mode}_{tag}"`` into ``(send_rank, batch_idx, mode, tag)``.

    The tag is everything after the third ``_`` (it may hold ``_`` itself); the mode may not.

    Args:
        channel_message: a message built for a decoupled shard.

    Raises:
        ValueError: fewer than four parts, or a rank/index that is not an integer.
    """
    parts = channel_message.split("_", 3)
    if len(parts) != 4:
        raise ValueError(
            f"channel message {channel_message!r} is not of the form '{{send_rank}}_{{batch_idx}}_{{mode}}_{{tag}}'"
        )
    send_rank, batch_idx, mode, tag = parts
    try:
        return int(send_rank), int(batch_idx), mode, tag
    except ValueError:
        raise ValueError(
            f"channel message {channel_message!r}: send rank {send_rank!r} and batch index {batch_idx!r} must be integers"
        ) from None


# -- rank mapping ---------------------------------------------------------------------------------
def _check(condition: bool, message: str) -> None:
    if not condition:
        raise RouteSizeError(message)


def _check_sizes(batch_size: int, src_world_size: int, dst_world_size: int) -> None:
    _check(src_world_size >= 1, f"src_world_size ({src_world_size}) must be at least 1.")
    _check(dst_world_size >= 1, f"dst_world_size ({dst_world_size}) must be at least 1.")
    _check(batch_size >= 0, f"batch_size ({batch_size}) must not be negative.")
    _check(
        batch_size % src_world_size == 0,
        f"batch_size ({batch_size}) must be divisible by src_world_size ({src_world_size}).",
    )
    _check(
        batch_size % dst_world_size == 0,
        f"batch_size ({batch_size}) must be divisible by dst_world_size ({dst_world_size}).",
    )


def _overlaps(begin: int, end: int, chunk: int) -> list[tuple[int, int]]:
    """``(i, n)`` for each chunk ``i`` (items ``[i*chunk, (i+1)*chunk)``) sharing ``n > 0`` items with ``[begin, end)``."""
    out = []
    while begin < end:
        index = begin // chunk
        size = min((index + 1) * chunk, end) - begin
        out.append((index, size))
        begin += size
    return out


class CommMapper:
    """Rank pairing between two groups that share one logical batch, each holding it in rank order."""

    @staticmethod
    def build_channel_key(src_rank: int, dst_rank: int, extra: str) -> str:
        """The channel key ``"{src_rank}_{dst_rank}_{extra}"`` of a fixed rank pair (RLinf's format).

        Args:
            src_rank: the sending rank.
            dst_rank: the receiving rank.
            extra: what tells apart streams between the same two ranks (a tag or step).
        """
        return f"{src_rank}_{dst_rank}_{extra}"

    @staticmethod
    def decoupled_get_batch_size(
        batch_size: int, src_world_size: int, dst_world_size: int, queue_size: int = 0
    ) -> list[int]:
        """The sizes of the shards one rank sends (or takes) in decoupled routing.

        Each shard holds ``batch_size // max(src_world_size, dst_world_size)`` items. The
        side with at least as many ranks as the other handles one shard per rank; the
        side with fewer handles ``dst_world_size // src_world_size`` of them, or only
        ``queue_size`` when it is positive.

        Args:
            batch_size: the logical batch size over the whole group.
            src_world_size: ranks on this side.
            dst_world_size: ranks on the other side.
            queue_size: how many shards to take at once when this side is the smaller (0: all).

        Raises:
            RouteSizeError: ``batch_size`` not divisible by the larger world size, a world
                size below 1, or ``queue_size`` above ``dst_world_size // src_world_size``.
        """
        _check(src_world_size >= 1 and dst_world_size >= 1, f"world sizes must be at least 1, got {src_world_size} and {dst_world_size}.")
        split_size = max(src_world_size, dst_world_size)
        _check(batch_size >= 0 and batch_size % split_size == 0, f"batch_size ({batch_size}) must be divisible by split_size ({split_size}).")
        shard = batch_size // split_size
        if src_world_size >= dst_world_size:
            return [shard]
        per_rank = dst_world_size // src_world_size
        if queue_size <= 0:
            return [shard] * per_rank
        _check(
            queue_size <= per_rank,
            f"queue_size {queue_size} should be less than (dst_world_size {dst_world_size} // src_world_size {src_world_size})",
        )
        return [shard] * queue_size

    @staticmethod
    def get_dst_ranks(batch_size: int, src_world_size: int, dst_world_size: int, src_rank: int) -> list[tuple[int, int]]:
        """``(dst_rank, n_items)`` for each destination rank that gets some of ``src_rank``'s items, in rank order.

        Args:
            batch_size: the logical batch size over the whole group.
            src_world_size: ranks of the source group.
            dst_world_size: ranks of the destination group.
            src_rank: the sending rank.

        Raises:
            RouteSizeError: a world size does not divide ``batch_size``, is below 1, or
                ``src_rank`` is out of range.
        """
        _check_sizes(batch_size, src_world_size, dst_world_size)
        _check(0 <= src_rank < src_world_size, f"src_rank ({src_rank}) must be in [0, {src_world_size}).")
        per_src, per_dst = batch_size // src_world_size, batch_size // dst_world_size
        if per_src == 0:
            return []
        return _overlaps(src_rank * per_src, (src_rank + 1) * per_src, per_dst)

    @staticmethod
    def get_src_ranks(batch_size: int, src_world_size: int, dst_world_size: int, dst_rank: int) -> list[tuple[int, int]]:
        """``(src_rank, n_items)`` for each source rank that sends ``dst_rank`` some items, in rank order.

        Args:
            batch_size: the logical batch size over the whole group.
            src_world_size: ranks of the source group.
            dst_world_size: ranks of the destination group.
            dst_rank: the receiving rank.

        Raises:
            RouteSizeError: a world size does not divide ``batch_size``, is below 1, or
                ``dst_rank`` is out of range.
        """
        _check_sizes(batch_size, src_world_size, dst_world_size)
        _check(0 <= dst_rank < dst_world_size, f"dst_rank ({dst_rank}) must be in [0, {dst_world_size}).")
        per_src, per_dst = batch_size // src_world_size, batch_size // dst_world_size
        if per_dst == 0:
            return []
        return _overlaps(dst_rank * per_dst, (dst_rank + 1) * per_dst, per_src)


# -- plans ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RouteEntry:
    """One shard of a coupled plan: the peer rank, how many items, and the channel key."""

    peer_rank: int
    batch_size: Optional[int]
    key: Any


@dataclass(frozen=True)
class DecoupledRouteEntry:
    """One shard of a decoupled plan: how many items, the channel key, and its channel message
    (``None`` on the receiving side, which learns it from the shard)."""

    batch_size: Optional[int]
    key: Any
    batch_index: Optional[str]


@dataclass(frozen=True)
class RoutePlan:
    """The shards one rank sends (``src_rank`` set) or receives (``dst_rank`` set), in order."""

    src_group_name: str
    dst_group_name: str
    src_rank: Optional[int]
    dst_rank: Optional[int]
    src_world_size: int
    dst_world_size: int
    tag: str
    route_key: Any
    entries: list


def normalize_route_tag(tag: Optional[str]) -> str:
    """``tag``, or ``"default"`` when it is ``None`` or empty."""
    return tag or ROUTING_DEFAULT_TAG


def normalize_route_key(route_key: Any) -> str:
    """``route_key`` as a string: ``""`` for ``None``, a string as it is, anything else by ``repr``."""
    if route_key is None:
        return ""
    if isinstance(route_key, str):
        return route_key
    return repr(route_key)


def build_route_channel_key(
    src_group_name: str,
    dst_group_name: str,
    src_rank: Optional[int],
    dst_rank: Optional[int],
    tag: Optional[str],
    route_key: Any = None,
) -> tuple:
    """The channel key of one route: ``("scheduler_route", src_group_name, dst_group_name,
    normalize_route_tag(tag), normalize_route_key(route_key), src_rank, dst_rank)``.

    Ranks are ``None`` in decoupled routing where either side is any worker.
    """
    return (
        ROUTING_KEY_PREFIX,
        src_group_name,
        dst_group_name,
        normalize_route_tag(tag),
        normalize_route_key(route_key),
        src_rank,
        dst_rank,
    )


def build_send_key(
    *,
    src_group_name: str,
    dst_group_name: str,
    src_rank: Optional[int],
    dst_rank: Optional[int],
    tag: Optional[str],
    route_key: Any = None,
) -> tuple:
    """The channel key to put a shard under for the route ``src_rank`` -> ``dst_rank``.

    The same key as ``build_route_channel_key`` (keyword arguments only). ``tag`` and
    ``route_key`` separate streams that share the same ranks.

    Args:
        src_group_name: the sending group.
        dst_group_name: the receiving group.
        src_rank: the sending rank (None: any, in decoupled routing).
        dst_rank: the receiving rank (None: any, in decoupled routing).
        tag: the stream's tag (None or empty: ``"default"``).
        route_key: a further key of the stream (None: none; a non-string by its ``repr``).
    """
    return build_route_channel_key(src_group_name, dst_group_name, src_rank, dst_rank, tag, route_key)


def build_send_plan(
    *,
    src_group_name: str,
    dst_group_name: str,
    src_rank: int,
    src_world_size: int,
    dst_world_size: int,
    tag: Optional[str],
    route_key: Any = None,
    batch_size: int,
) -> RoutePlan:
    """The shards ``src_rank`` sends in coupled routing: one ``RouteEntry`` per destination rank.

    Args:
        src_group_name: the two groups (they go into the keys).
        dst_group_name: the two groups (they go into the keys).
        src_rank: the sending rank.
        src_world_size: the groups' sizes.
        dst_world_size: the groups' sizes.
        tag: separate streams (see ``build_route_channel_key``).
        route_key: separate streams (see ``build_route_channel_key``).
        batch_size: the logical batch size over the whole source group.

    Raises:
        RouteSizeError: as ``CommMapper.get_dst_ranks``.
    """
    shards = CommMapper.get_dst_ranks(batch_size, src_world_size, dst_world_size, src_rank)
    return _coupled_plan(src_group_name, dst_group_name, src_rank, None, src_world_size, dst_world_size, tag,
                         route_key, shards)


def build_recv_plan(
    *,
    src_group_name: str,
    dst_group_name: str,
    dst_rank: int,
    src_world_size: int,
    dst_world_size: int,
    tag: Optional[str],
    route_key: Any = None,
    batch_size: int,
) -> RoutePlan:
    """The shards ``dst_rank`` receives in coupled routing: one ``RouteEntry`` per source rank,
    in source-rank order (merging them in that order restores the destination's items).

    Args:
        src_group_name: the two groups (they go into the keys).
        dst_group_name: the two groups (they go into the keys).
        dst_rank: the receiving rank.
        src_world_size: the groups' sizes.
        dst_world_size: the groups' sizes.
        tag: separate streams (see ``build_route_channel_key``).
        route_key: separate streams (see ``build_route_channel_key``).
        batch_size: the logical batch size over the whole group (as in the send plan).

    Raises:
        RouteSizeError: as ``CommMapper.get_src_ranks``.
    """
    shards = CommMapper.get_src_ranks(batch_size, src_world_size, dst_world_size, dst_rank)
    return _coupled_plan(src_group_name, dst_group_name, None, dst_rank, src_world_size, dst_world_size, tag,
                         route_key, shards)


def _coupled_plan(src_group_name, dst_group_name, src_rank, dst_rank, src_world_size, dst_world_size, tag,
                  route_key, shards) -> RoutePlan:
    """The plan of the one side whose rank is given, from its ``(peer rank, size)`` shards."""
    entries = [
        RouteEntry(
            peer_rank=peer,
            batch_size=size,
            key=build_route_channel_key(src_group_name, dst_group_name, peer if src_rank is None else src_rank,
                                        peer if dst_rank is None else dst_rank, tag, route_key),
        )
        for peer, size in shards
    ]
    return RoutePlan(src_group_name, dst_group_name, src_rank, dst_rank, src_world_size, dst_world_size,
                     normalize_route_tag(tag), route_key, entries)


def decoupled_build_send_plan(
    *,
    src_group_name: str,
    dst_group_name: str,
    src_rank: Optional[int],
    src_world_size: int,
    dst_world_size: int,
    tag: Optional[str],
    route_key: Any = None,
    batch_size: int,
    mode: Optional[str] = None,
    tag_batch_router: Optional[list[str]] = None,
    send_queue_size: int = 0,
) -> RoutePlan:
    """The shards one rank sends in decoupled routing.

    Without ``tag_batch_router`` (a first leg), shard ``i`` carries the message
    ``"{src_rank}_{i}_{mode}_{tag}"`` and is keyed for any receiver (both key ranks
    ``None``). With it (an answer), shard ``i`` goes back under ``tag_batch_router[i]``,
    keyed to the rank and tag that message names; the plan's ``dst_rank`` and ``tag``
    are then the last shard's.

    Args:
        src_group_name: the two groups (they go into the keys).
        dst_group_name: the two groups (they go into the keys).
        src_rank: this rank, encoded in the messages of a first leg.
        src_world_size: the groups' sizes.
        dst_world_size: the groups' sizes.
        tag: separate streams (see ``build_route_channel_key``).
        route_key: separate streams (see ``build_route_channel_key``).
        batch_size: the logical batch size over the whole group.
        mode: a phase name written into the messages (``"train"``, ``"eval"``).
        tag_batch_router: the messages of the shards being answered, in order.
        send_queue_size: as ``queue_size`` of ``CommMapper.decoupled_get_batch_size``.

    Raises:
        RouteSizeError: as ``CommMapper.decoupled_get_batch_size``.
        ValueError: ``tag_batch_router`` has fewer messages than the plan has shards, or
            holds a malformed one.
    """
    sizes = CommMapper.decoupled_get_batch_size(batch_size, src_world_size, dst_world_size, send_queue_size)
    if tag_batch_router is not None and len(tag_batch_router) < len(sizes):
        raise ValueError(f"tag_batch_router holds {len(tag_batch_router)} message(s) for {len(sizes)} shard(s)")
    entries, send_rank = [], None
    for index, size in enumerate(sizes):
        if tag_batch_router is not None:
            batch_index = tag_batch_router[index]
            send_rank, _, _, tag = split_channel_message(batch_index)
        else:
            batch_index = _build_channel_message(src_rank, index, mode, tag)
        key = build_route_channel_key(src_group_name, dst_group_name, None, send_rank, tag, route_key)
        entries.append(DecoupledRouteEntry(batch_size=size, key=key, batch_index=batch_index))
    return RoutePlan(
        src_group_name, dst_group_name, None, send_rank, src_world_size, dst_world_size,
        normalize_route_tag(tag), route_key, entries,
    )


def decoupled_build_recv_plan(
    *,
    src_group_name: str,
    dst_group_name: str,
    recv_rank: Optional[int],
    src_world_size: int,
    dst_world_size: int,
    tag: Optional[str],
    route_key: Any = None,
    batch_size: int,
    recv_queue_size: int = 0,
) -> RoutePlan:
    """The shards one rank takes in decoupled routing, all under the key for ``recv_rank``
    (``None``: shards any rank may take; a rank: answers addressed to it).

    The entries' ``batch_index`` is ``None``: each shard carries its own message.
    ``src_world_size`` is the taking side's size and ``dst_world_size`` the other's, as
    RLinf's callers pass them.

    Args:
        src_group_name: the two groups (they go into the keys).
        dst_group_name: the two groups (they go into the keys).
        recv_rank: the rank answers are addressed to, or ``None``.
        src_world_size: see above.
        dst_world_size: see above.
        tag: separate streams (see ``build_route_channel_key``).
        route_key: separate streams (see ``build_route_channel_key``).
        batch_size: the logical batch size over the whole group.
        recv_queue_size: as ``queue_size`` of ``CommMapper.decoupled_get_batch_size``.

    Raises:
        RouteSizeError: as ``CommMapper.decoupled_get_batch_size``.
    """
    key = build_route_channel_key(src_group_name, dst_group_name, None, recv_rank, tag, route_key)
    entries = [
        DecoupledRouteEntry(batch_size=size, key=key, batch_index=None)
        for size in CommMapper.decoupled_get_batch_size(batch_size, src_world_size, dst_world_size, recv_queue_size)
    ]
    return RoutePlan(
        src_group_name, dst_group_name, None, None, src_world_size, dst_world_size,
        normalize_route_tag(tag), route_key, entries,
    )


# -- group sizes ------------------------------------------------------------------------------------
def get_group_info(manager_proxy: Any, group_name: str) -> WorkerInfo:
    """The ``WorkerInfo`` of rank 0 of the running group ``group_name``.

    Args:
        manager_proxy: where groups are registered: RLinf's manager proxy (anything with
            ``get_worker_info(WorkerAddress)``), a launcher session (anything with
            ``lookup_group(name)``), or ``None`` for this process's cluster session.
        group_name: the group's name.

    Raises:
        ValueError: no such group is registered.
        RuntimeError: ``manager_proxy`` is ``None`` and no cluster runtime is loaded.
    """
    if manager_proxy is not None and hasattr(manager_proxy, "get_worker_info"):
        info = manager_proxy.get_worker_info(WorkerAddress(group_name, ranks=0))
        if info is None:
            raise ValueError(f"Worker group '{group_name}' is not registered.")
        return info
    record = _group_record(manager_proxy, group_name)
    return record.workers[0].info


def _group_record(manager_proxy: Any, group_name: str):
    if manager_proxy is None:
        from ..plugins.launcher import current_session

        manager_proxy = current_session()
    record = manager_proxy.lookup_group(group_name)
    if record is None or not record.workers:
        raise ValueError(f"Worker group '{group_name}' is not registered.")
    return record


def get_group_world_size(manager_proxy: Any, group_name: str) -> int:
    """How many workers the running group ``group_name`` has.

    Args:
        manager_proxy: as in ``get_group_info`` (``None``: this process's cluster session).
        group_name: the group's name.

    Raises:
        ValueError: no such group is registered.
        RuntimeError: ``manager_proxy`` is ``None`` and no cluster runtime is loaded.
    """
    if manager_proxy is not None and hasattr(manager_proxy, "get_worker_info"):
        return get_group_info(manager_proxy, group_name).group_world_size
    return len(_group_record(manager_proxy, group_name).workers)
