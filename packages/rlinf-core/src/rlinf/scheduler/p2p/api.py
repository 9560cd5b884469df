"""The functions behind ``Worker.send``/``recv``/``send_tensor``/``recv_tensor``/``broadcast``."""

from __future__ import annotations

from typing import Any, Optional

from .. import config
from ..address import resolve_address
from ..errors import CommunicationError
from .async_work import AsyncWork
from .communicator import local_communicator
from .options import CollectiveGroupOptions


_peers: dict = {}


def _peer(group_name, rank):
    key = (group_name, rank if isinstance(rank, int) else tuple(rank) if isinstance(rank, (list, tuple)) else rank)
    peer = _peers.get(key)
    if peer is None:
        if not isinstance(group_name, str):
            raise TypeError(f"a group name must be a str, got {group_name!r}")
        peer = resolve_address(group_name, rank)
        if len(_peers) < 4096:
            _peers[key] = peer
    return peer


def _setup(group_name, rank, options, timeout):
    if options is not None and not isinstance(options, CollectiveGroupOptions):
        raise TypeError(f"options must be a CollectiveGroupOptions, got {type(options).__name__}")
    peer = _peer(group_name, rank)
    if timeout is None and options is not None:
        timeout = options.timeout
    return (
        local_communicator(create=True),
        peer,
        options.transport if options is not None else None,
        config.resolve_timeout(timeout),
    )


def _check_tensor(tensor, what: str, group_name, rank):
    what = f"{what} ({'to' if what == 'send_tensor' else 'from'} group {group_name!r} rank {rank})"
    torch = __import__("sys").modules.get("torch")
    if torch is None or not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what} takes a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what} needs a contiguous tensor (call .contiguous() first); got strides {tensor.stride()}")
    if tensor.device.type != "cpu":
        raise CommunicationError(
            f"{what} of a {tensor.device.type} tensor needs a transport for that device (install rlinf-nccl)"
        )


def send(obj: Any, dst_group_name: str, dst_rank, async_op=False, options=None, timeout=None):
    comm, peer, transport, timeout = _setup(dst_group_name, dst_rank, options, timeout)
    result = comm.send_object(obj, peer, transport, timeout, async_op)
    return result if async_op else None


def recv(src_group_name: str, src_rank, async_op=False, options=None, timeout=None):
    comm, peer, transport, timeout = _setup(src_group_name, src_rank, options, timeout)
    return comm.recv_object(peer, transport, timeout, async_op)


def send_tensor(tensor, dst_group_name: str, dst_rank, async_op=False, options=None, timeout=None):
    _check_tensor(tensor, "send_tensor", dst_group_name, dst_rank)
    comm, peer, transport, timeout = _setup(dst_group_name, dst_rank, options, timeout)
    result = comm.send_tensor(tensor, peer, transport, timeout, async_op)
    return result if async_op else None


def recv_tensor(tensor, src_group_name: str, src_rank, async_op=False, options=None, timeout=None):
    _check_tensor(tensor, "recv_tensor", src_group_name, src_rank)
    comm, peer, transport, timeout = _setup(src_group_name, src_rank, options, timeout)
    result = comm.recv_tensor(tensor, peer, transport, timeout, async_op)
    return result if async_op else None


def broadcast(obj: Any = None, groups: Optional[list] = None, src: Optional[tuple] = None, async_op=False, options=None, timeout=None):
    """The source sends its object to every other listed worker; everyone returns it."""
    if not groups or src is None:
        raise ValueError("broadcast needs groups=[(group_name, ranks), ...] and src=(group_name, rank)")
    comm = local_communicator(create=True)
    src_addr = resolve_address(*src)
    members = []
    for group_name, ranks in groups:
        for r in ([ranks] if isinstance(ranks, int) else ranks):
            members.append(resolve_address(group_name, r))
    me = comm.address
    if me not in members and me != src_addr:
        raise ValueError(f"{me.get_name()!r} calls broadcast but is not among its groups {groups}")
    if me == src_addr:
        works = [
            send(obj, dst.group_key, dst.rank, async_op=True, options=options, timeout=timeout)
            for dst in members
            if dst != me
        ]
        gathered = AsyncWork.gather(works, obj, "broadcast")
        return gathered if async_op else gathered.wait()
    return recv(src_addr.group_key, src_addr.rank, async_op=async_op, options=options, timeout=timeout)
