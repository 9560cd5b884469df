"""The functions behind ``Worker.send``/``recv``/``send_tensor``/``recv_tensor``/``broadcast``."""

from __future__ import annotations

from typing import Any, Optional

from ...base import config
from ...base.address import resolve_address
from ...base.errors import CommunicationError
from ...transports.async_work import AsyncWork
from .communicator import local_communicator
from ...plugins.options import CollectiveGroupOptions, honoured, unsupported_options
from ...base.hooks import hook


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
    if options is None:  # the common call: the peer from the cache, the default (or checked) timeout
        try:
            peer = _peers[(group_name, rank)]
        except (KeyError, TypeError):  # not seen yet, or a rank given as a list
            peer = _peer(group_name, rank)
        return (
            local_communicator(create=True),
            peer,
            None,
            config.default_timeout() if timeout is None else config.check_timeout(timeout),
        )
    if not isinstance(options, CollectiveGroupOptions):
        raise TypeError(f"options must be a CollectiveGroupOptions, got {type(options).__name__}")
    peer = _peer(group_name, rank)
    if timeout is None:
        timeout = options.timeout
    if options.transport_options():
        _note_ignored(options)
    return local_communicator(create=True), peer, options.transport, config.resolve_timeout(timeout)


def _note_ignored(options: CollectiveGroupOptions) -> None:
    """Tuning fields configure device links only; say once which ones the pair's CPU transport ignores."""
    from ...plugins import get_registry

    try:
        entry = get_registry().transport(options.transport, "cpu")
    except Exception:
        return  # the send itself reports an unknown transport
    unsupported_options(options, entry.name, honoured(entry.descriptor))


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
    result = comm.send_object(obj, peer, transport, timeout, async_op, options)
    return result if async_op else None


def recv(src_group_name: str, src_rank, async_op=False, options=None, timeout=None):
    comm, peer, transport, timeout = _setup(src_group_name, src_rank, options, timeout)
    return comm.recv_object(peer, transport, timeout, async_op, options)


def send_tensor(tensor, dst_group_name: str, dst_rank, async_op=False, options=None, timeout=None):
    _check_tensor(tensor, "send_tensor", dst_group_name, dst_rank)
    comm, peer, transport, timeout = _setup(dst_group_name, dst_rank, options, timeout)
    result = comm.send_tensor(tensor, peer, transport, timeout, async_op, options)
    return result if async_op else None


@hook("p2p_recv_tensor")
def recv_tensor(tensor, src_group_name: str, src_rank, async_op=False, options=None, timeout=None):
    _check_tensor(tensor, "recv_tensor", src_group_name, src_rank)
    comm, peer, transport, timeout = _setup(src_group_name, src_rank, options, timeout)
    result = comm.recv_tensor(tensor, peer, transport, timeout, async_op, options)
    return result if async_op else None


def _expand_ranks(group_name, ranks) -> list:
    """RLinf's rank forms: an int, a tuple rank path, or a list of either."""
    if isinstance(ranks, bool):
        raise TypeError(f"broadcast: ranks of group {group_name!r} must be ints or tuple rank paths, got {ranks!r}")
    if isinstance(ranks, (int, tuple)):
        return [ranks]
    if isinstance(ranks, list) and ranks:
        out = []
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, (int, tuple)):
                raise TypeError(f"broadcast: each rank of group {group_name!r} must be an int or a tuple rank path, got {r!r}")
            out.append(r)
        return out
    raise TypeError(
        f"broadcast: ranks of group {group_name!r} must be an int, a tuple rank path or a non-empty list of them, "
        f"got {ranks!r}"
    )


def broadcast_members(groups) -> list:
    """The addresses of ``groups=[(group_name, ranks), ...]`` in order, without duplicates."""
    if not groups or isinstance(groups, (str, bytes)):
        raise ValueError("broadcast needs groups=[(group_name, ranks), ...] naming at least one worker")
    members = []
    for entry in groups:
        if not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise ValueError(f"broadcast: each entry of groups must be (group_name, ranks), got {entry!r}")
        group_name, ranks = entry
        for r in _expand_ranks(group_name, ranks):
            addr = resolve_address(group_name, r)
            if addr not in members:
                members.append(addr)
    return members


@hook("broadcast")
def broadcast(obj: Any = None, groups: Optional[list] = None, src: Optional[tuple] = None, async_op=False, options=None,
              timeout=None, out=None, share_memory=False):
    """The source sends its object to every other listed worker; everyone returns it.

    ``src`` defaults to the first worker of the expanded ``groups`` list.
    ``timeout=None`` is the configured default (``config.resolve_timeout``),
    never an unbounded wait.
    ``out`` (receivers; ignored on the source): a tensor, or a dict, list or
    tuple of tensors, filled in place with what the source broadcast and
    returned; shapes and dtypes are checked against the source's before any
    byte is written.

    ``share_memory=True`` (receivers with ``out``): on the source's host,
    ``out``'s tensors are not copied into but moved, as
    ``Tensor.share_memory_()`` moves a storage, onto the shared memory the
    source wrote once: the tensor objects, and every alias of their storage
    (a model's parameters behind ``model.state_dict()``), read the new
    values, and the receivers on that host hold one copy between them.
    The source never writes memory a receiver's tensors are on (the next
    broadcast moves them onto another segment).  Receivers holding the
    same broadcast share its memory: an in-place write to those tensors
    (``load_state_dict``, merging an adapter into them) is seen by the
    others, until a broadcast moves them (one filled by copying first gives
    them private memory again).  As with ``share_memory_()``, pointers
    taken before (``t.numpy()``, ``data_ptr()``) keep pointing at the old
    memory, which stays valid until the next broadcast.  A tensor that is a
    view of a larger storage is copied into; so is ``out`` on another host
    or transport.
    See ``broadcast.py`` for how the payload travels.
    """
    members = broadcast_members(groups)
    if src is None:
        src_addr = members[0]
    else:
        if not isinstance(src, (tuple, list)) or len(src) != 2:
            raise ValueError(f"broadcast: src must be (group_name, rank), got {src!r}")
        src_addr = resolve_address(*src)
    if options is not None and not isinstance(options, CollectiveGroupOptions):
        raise TypeError(f"options must be a CollectiveGroupOptions, got {type(options).__name__}")
    _check_out(out)
    if not isinstance(share_memory, bool):
        raise TypeError(f"broadcast: share_memory must be a bool, got {share_memory!r}")
    comm = local_communicator(create=True)
    me = comm.address
    if me not in members and me != src_addr:
        raise ValueError(f"{me.get_name()!r} calls broadcast but is not among its groups {groups}")
    if share_memory and out is None and me != src_addr:
        raise ValueError(f"{me.get_name()!r}: broadcast(share_memory=True) on a receiver needs out= (the tensors "
                         f"to share)")
    if options is not None and timeout is None:
        timeout = options.timeout
    transport = options.transport if options is not None else None
    if comm.transport_name(transport) == "cpu":
        from . import broadcast as fast

        return fast.broadcast(comm, obj, members, src_addr, None if me == src_addr else out, transport,
                              config.resolve_timeout(timeout), async_op, share_memory)
    # another transport (a device or MPI plugin): one send per receiver through it
    if me == src_addr:
        works = [
            send(obj, dst.group_key, dst.rank, async_op=True, options=options, timeout=timeout)
            for dst in members
            if dst != me
        ]
        gathered = AsyncWork.gather(works, obj, "broadcast")
        return gathered if async_op else gathered.wait()
    got = recv(src_addr.group_key, src_addr.rank, async_op=async_op, options=options, timeout=timeout)
    if out is None:
        return got
    from .broadcast import copy_into

    if async_op:
        return got.then(lambda value: copy_into(value, out, me.get_name()))
    return copy_into(got, out, me.get_name())


def _check_out(out) -> None:
    if out is None:
        return
    torch = __import__("sys").modules.get("torch")
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else [out]
    if torch is None or not all(isinstance(v, torch.Tensor) for v in values):
        raise TypeError(f"broadcast: out= must be a tensor, or a dict, list or tuple of tensors; got "
                        f"{type(out).__name__}")
