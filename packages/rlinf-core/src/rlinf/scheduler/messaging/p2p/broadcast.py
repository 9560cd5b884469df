"""``broadcast``: one source, many receivers, the payload written once.

Every participant derives the same plan from the member list and the group
registry (no round of messages decides it):

* receivers on the source's host (unless ``RLINF_CPU_LOCAL=0``) connect to
  the source over its Unix socket.  The source writes the payload once into
  a ``memfd`` segment and hands that same segment to each of them
  (``SocketLink.send_fds``, ``SCM_RIGHTS``).  A receiver with ``out=``
  copies out of it (in parallel with the others); one without maps it
  copy-on-write and gets tensors that are views of it (zero copies; its
  writes stay its own).  Segments are reused, because faulting in fresh
  memory costs more than the copy itself: the source keeps a segment for
  the next broadcast once every receiver copied out, and a receiver with
  ``out=`` keeps its mapping of its feeder's segment (one per feeder), so a
  training loop's broadcasts touch only warm pages.  A segment a receiver
  still holds views of is lent, never written: the receiver reports it
  released (with its next connection to that feeder) once the last view is
  gone, and only then does it go back to the pool.  A receiver with ``out=`` and
  ``share_memory=True`` copies nothing: it moves the storages behind its
  tensors onto the segment (its kept shared mapping of it), and the
  segment is lent to it, as to views, until no storage of it is on that
  segment (the next broadcast moves them to another one).  A source holds at most
  one free segment and three lent ones (a receiver swapping weights holds
  the last round's views while the next arrives: two are lent then); past
  that the oldest lent one is closed on the source, and the kernel frees it
  with its last view.
* the others form a chain, grouped by host: each connects to its
  predecessor (the source for the first), receives the payload in chunks (sized by
  ``_chunk_for``) straight into its destination (its own
  socket, no read-ahead copy) and forwards every chunk to its successor as
  soon as it has it, so the whole takes about one transfer plus a chunk per
  hop, however long the chain.

Receivers connect *upstream*, to the worker that feeds them; the feeding
side finds the connection in its inbox (a communicator service) and serves
it.  Acknowledgements travel back up the same links and carry the failures
seen below (a receiver that refused ``out=``, one that died or timed out),
so the source reports every receiver that did not get the payload, by name,
within the operation's timeout.  A receiver that dies mid-way closes its
link: its feeder sees that at once, keeps draining its own input (nothing
stalls upstream) and reports it.

``out=`` receives in place: the source describes each tensor (key, dtype,
shape) before any data, and a receiver checks its containers against that
description before it writes a byte.  A mismatch is refused with an error
naming the key; the receiver still relays the payload to its successor.

Broadcasts of one process run one at a time, in call order (``async_op``
ones on a serial thread), so a process's connections to a peer pair up
with that peer's calls in order.

Like MPI's eager and rendezvous protocols, a small payload (at most
``RLINF_BROADCAST_EAGER_KB``, default 1024) is copied and served in the
background, so the source returns at once, as a point-to-point ``send``
does, even if no receiver has called ``broadcast`` yet; a failure then
(a receiver that never comes within the timeout) is logged on the
source.  A larger one waits for its receivers: it is written once and
read in place, so it cannot be released before they have it.  Objects holding device tensors, and
broadcasts through a transport other than ``cpu``, take the point-to-point
path (one send per receiver).
"""

from __future__ import annotations

import collections
import json
import os
import pickle
import secrets
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Optional

from ...base.errors import CommTimeoutError, CommunicationError, PeerDiedError
from ...base.security import HandshakeError
from ...base.hooks import hook
from ...transports import codec, device_routing
from ...transports.async_work import AsyncWork
from ...transports.ordering import SerialRunner, Turnstile

SERVICE = "rlinf-broadcast"
CHUNK_ENV = "RLINF_BROADCAST_CHUNK_MB"
EAGER_ENV = "RLINF_BROADCAST_EAGER_KB"
LOCAL_ENV = "RLINF_CPU_LOCAL"
_ALIGN = 64
#: seconds between liveness probes of a peer that has not joined yet
PROBE_INTERVAL = 1.0
#: segments a source keeps ready for reuse, and segments it keeps while receivers hold views of them
#: (receivers that swap weights hold the last round's views while the next arrives: two are lent then)
_MAX_FREE = 1
_MAX_LENT = 3
#: mappings a receiver keeps per feeder: receivers sharing memory alternate between two segments
_MAX_MAPPED = 3
#: release reports a receiver keeps per source until its next connection there (the source lends at most 3)
_MAX_REPORTS = 16


def _chunk_bytes() -> int:
    return max(1 << 16, int(float(os.environ.get(CHUNK_ENV, "4")) * (1 << 20)))


_MIN_AUTO_CHUNK = 256 << 10


def _chunk_for(total: int, hops: int) -> int:
    """The chain's chunk size: ``RLINF_BROADCAST_CHUNK_MB`` when set; else at most 4 MiB, and small enough
    that filling the pipeline (one chunk per hop) adds at most an eighth of a transfer (not below 256 KiB,
    where a chunk's own cost starts to show on fast links).  64 MiB down 8 hops on 1 Gbit/s links: 1 MiB
    chunks, 0.61 s where 4 MiB ones took 0.82 s and one transfer takes 0.54 s."""
    if os.environ.get(CHUNK_ENV):
        return _chunk_bytes()
    most = 4 << 20
    if hops <= 1:
        return most
    return min(most, max(_MIN_AUTO_CHUNK, total // (8 * hops) // (64 << 10) * (64 << 10)))


def _eager_bytes() -> int:
    return max(0, int(float(os.environ.get(EAGER_ENV, "1024")) * 1024))


def _eager_payload(obj) -> Optional[_Payload]:
    """The payload, copied, when it is small enough to serve after the source returned; else None."""
    payload = encode(obj)
    if sum(b.nbytes for b in payload.buffers) > _eager_bytes():
        return None
    return _Payload(payload.meta, [memoryview(bytes(b)) for b in payload.buffers])


def _layout(sizes: list) -> tuple[list, int]:
    offsets, pos = [], 0
    for n in sizes:
        offsets.append(pos)
        pos += -(-n // _ALIGN) * _ALIGN
    return offsets, pos


# -- per-process state ---------------------------------------------------------------
class _State:
    """One communicator's broadcast inbox, call order and segments (as a source and as a receiver)."""

    def __init__(self):
        self.cond = threading.Condition()
        self.inbox: dict[str, list] = {}  # connecting peer -> [(seq, link)], lowest seq first
        self.seq: dict[str, int] = {}  # peer -> seq of our next connection to it
        self.turnstile = Turnstile()
        self.runner = SerialRunner("rlinf-broadcast")
        self.segment_lock = threading.Lock()
        self.next_seg_id = 1 << 31  # apart from the ids of a link's own pool
        self.closed = False
        # source side
        self.free: list = []  # segments no receiver maps: written over by the next broadcast
        self.lent: "collections.OrderedDict[str, tuple]" = collections.OrderedDict()  # token -> (seg, holders)
        self.early: "collections.OrderedDict[str, set]" = collections.OrderedDict()  # released before we recorded the lending
        self.last_served = time.monotonic()
        # receiver side
        # feeder -> [{(uid, dev, inode, size): shared mapping}, most recently used last; when last used]
        self.mapped: dict[str, list] = {}
        # feeder -> the private memory that tensors left for its segments in the last broadcast, freed at the
        # next one: a kernel another thread started on the old memory may still be reading it
        self.retired: dict[str, list] = {}
        self.released: dict[str, list] = {}  # feeder -> lending tokens of its segments whose views we dropped
        # filled by garbage-collector finalizers, which may run on a thread holding segment_lock: so no lock,
        # only an append (atomic); drained by connect
        self.reports: collections.deque = collections.deque(maxlen=4096)

    def accept(self, link, info: dict) -> None:
        """A peer connected to be fed by us (called on the handshake thread: never blocks)."""
        try:
            peer, seq = str(info["src"]), int(info["seq"])
            released = [str(t) for t in info.get("released", ())]
        except (KeyError, TypeError, ValueError):
            link.close()
            return
        if released:
            self._returned(peer, released)
        stale = []
        with self.cond:
            entries = self.inbox.setdefault(peer, [])
            for entry in list(entries):
                if entry[1].peer_closed():  # a peer that gave up on an earlier broadcast
                    entries.remove(entry)
                    stale.append(entry[1])
            entries.append((seq, link))
            entries.sort(key=lambda e: e[0])
            self.cond.notify_all()
        for old in stale:
            old.close()

    def take(self, comm, addr, deadline: float):
        """The link ``addr`` opened to us for this broadcast; probes it while waiting."""
        name = addr.get_name()
        record = comm._lookup(addr)
        next_probe = time.monotonic() + PROBE_INTERVAL
        while True:
            stale = []
            with self.cond:
                link = None
                entries = self.inbox.get(name)
                while entries:
                    _seq, candidate = entries.pop(0)
                    if candidate.peer_closed():
                        stale.append(candidate)
                        continue
                    link = candidate
                    break
                if link is None:
                    now = time.monotonic()
                    if now >= deadline:
                        raise TimeoutError("it did not join the broadcast")
                    if now < next_probe:
                        self.cond.wait(min(next_probe, deadline) - now)
            for old in stale:
                old.close()
            if link is not None:
                return link
            if time.monotonic() >= next_probe:
                record = comm._check_alive(addr, record, "cpu")  # raises ConnectionError once it is gone
                next_probe = time.monotonic() + PROBE_INTERVAL

    def connect(self, comm, addr, deadline: float):
        """Open a link to ``addr``, which feeds us in this broadcast."""
        name = addr.get_name()
        with self.cond:
            seq = self.seq.get(name, 0)
            self.seq[name] = seq + 1
        with self.segment_lock:
            while self.reports:
                feeder, token = self.reports.popleft()
                self.released.setdefault(feeder, []).append(token)
            released = self.released.pop(name, [])[-_MAX_REPORTS:]  # older ones were lent past the source's bound
        hello = json.dumps({"service": SERVICE, "src": comm.name, "seq": seq, "released": released}).encode()
        transport = comm._transports["cpu"]
        try:
            # again while the feeder is too busy to begin; not once the hello went out: the feeder may take
            # that connection late, and another one under the same seq would pair with its next broadcast
            return type(comm)._connect(transport, comm._lookup(addr).endpoints["cpu"], hello, deadline,
                                       again_after_hello=False)
        except (ConnectionError, OSError) as exc:
            if isinstance(exc, (TimeoutError, HandshakeError)):
                # the feeder may have taken that connection already: another one under the same seq would pair
                # with its next broadcast, so fail this one instead
                raise
            # its group may have been relaunched under the same name: look again, once
            return transport.connect(comm._lookup(addr, refresh=True).endpoints["cpu"], hello, deadline)

    # -- segments, source side --------------------------------------------------------
    def acquire_segment(self, nbytes: int):
        """A segment no receiver maps, with room for ``nbytes``: a warm one from the pool if one fits."""
        from ...transports.shm import create_segment

        with self.segment_lock:
            self.last_served = time.monotonic()
            for seg in self.free:
                if nbytes <= seg.capacity <= max(2 * nbytes, nbytes + (8 << 20)):
                    self.free.remove(seg)
                    seg.token = secrets.token_hex(8)  # a fresh name per lending: a stale release cannot match it
                    return seg
            unfit, self.free = self.free, []  # the payload changed size: no stale segment stays held
            self.next_seg_id += 1
            seg_id = self.next_seg_id
        for old in unfit:
            old.close()
        seg = create_segment(seg_id, nbytes)
        seg.uid = secrets.token_hex(8)  # names the segment itself to receivers, apart from any other one
        seg.token = secrets.token_hex(8)
        return seg

    def release_segment(self, seg, holders: set, reusable: bool) -> None:
        """After a broadcast: back to the pool, lent to the receivers in ``holders`` (they keep views of
        it), or closed (a receiver that timed out may still read it)."""
        closing = []
        with self.segment_lock:
            holders = set(holders) - self.early.pop(seg.token, set())  # some may have let go already
            if not reusable or self.closed:
                closing.append(seg)
            elif holders:
                self.lent[seg.token] = (seg, holders)
                while len(self.lent) > _MAX_LENT:  # receivers that never come back: the kernel frees it with their views
                    closing.append(self.lent.popitem(last=False)[1][0])
            else:
                self._to_pool(seg, closing)
        for old in closing:
            old.close()

    def _to_pool(self, seg, closing: list) -> None:  # under segment_lock
        self.free.insert(0, seg)
        while len(self.free) > _MAX_FREE:
            closing.append(self.free.pop())

    def _returned(self, peer: str, tokens: list) -> None:
        """``peer`` dropped its views of these segments of ours; one nobody holds goes back to the pool."""
        closing = []
        with self.segment_lock:
            for token in tokens:
                entry = self.lent.get(token)
                if entry is None:  # perhaps before the broadcast that lent it recorded the lending
                    self.early.setdefault(token, set()).add(peer)
                    while len(self.early) > 4 * _MAX_REPORTS:
                        self.early.popitem(last=False)
                    continue
                entry[1].discard(peer)
                if not entry[1]:
                    del self.lent[token]
                    self._to_pool(entry[0], closing)
        for old in closing:
            old.close()

    # -- segments, receiver side ------------------------------------------------------------
    def shared_mapping(self, feeder: str, uid: Optional[str], fd: int, size: int):
        """A read-write mapping of the segment behind ``fd``: one kept from ``feeder``'s last broadcasts if
        it is the same segment (its pages are mapped already), else a new one, kept (``_MAX_MAPPED``)."""
        from ...transports.shm import map_shared

        st = os.fstat(fd)
        key = (uid, st.st_dev, st.st_ino, size)
        with self.segment_lock:
            entry = self.mapped.get(feeder)
            if entry is not None and key in entry[0]:
                entry[0].move_to_end(key)
                entry[1] = time.monotonic()
                return entry[0][key]
        buf = map_shared(fd, size)
        with self.segment_lock:
            entry = self.mapped.setdefault(feeder, [collections.OrderedDict(), 0.0])
            entry[0][key] = buf
            while len(entry[0]) > _MAX_MAPPED:  # unmapped once nothing views it
                entry[0].popitem(last=False)
            entry[1] = time.monotonic()
        return buf

    def forget_mapping(self, feeder: str) -> None:
        with self.segment_lock:
            self.mapped.pop(feeder, None)

    def drop_idle(self, idle: float) -> int:
        """Let go of segments no broadcast used for ``idle`` seconds; returns how many.

        As a receiver: the mapping kept from a source that stopped broadcasting
        (or whose group ended) would keep that segment's memory alive.  As a
        source: its pool, free and lent (a receiver that never connects again
        never reports its views gone; the kernel frees those with the views)."""
        now = time.monotonic()
        closing = []
        with self.segment_lock:
            stale = [f for f, entry in self.mapped.items() if now - entry[1] >= idle]
            for feeder in stale:
                del self.mapped[feeder]
                self.retired.pop(feeder, None)
            if now - self.last_served >= idle:
                closing = self.free + [seg for seg, _h in self.lent.values()]
                self.free = []
                self.lent.clear()
        for seg in closing:
            seg.close()
        return len(stale) + len(closing)

    def lend(self, feeder: str, token: Optional[str], buf) -> None:
        """Report ``token`` released to ``feeder`` (on our next connection to it) once ``buf`` is gone."""
        if token is not None:
            weakref.finalize(buf, self.reports.append, (feeder, token))  # no lock: see reports

    def close(self) -> None:
        with self.segment_lock:
            self.closed = True
            segs = self.free + [seg for seg, _h in self.lent.values()]
            self.free, self.mapped, self.retired = [], {}, {}
            self.lent.clear()
        for seg in segs:
            seg.close()
        with self.cond:
            links = [link for entries in self.inbox.values() for _s, link in entries]
            self.inbox.clear()
        for link in links:
            link.close()


def install(comm) -> None:
    """Give ``comm`` its broadcast state and route broadcast connections to it."""
    comm.broadcast_state = _State()
    comm.add_service(SERVICE, comm.broadcast_state.accept)


# -- the payload ----------------------------------------------------------------------
@dataclass
class _Payload:
    meta: dict
    buffers: list  # memoryviews, in codec order


def _tensor_items(obj) -> Optional[tuple[str, list]]:
    """``(container, [(key, tensor)])`` for a tensor or a non-empty dict/list/tuple of CPU tensors."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if isinstance(obj, torch.Tensor):
        container, items = "tensor", [(None, obj)]
    elif isinstance(obj, dict) and obj:
        container, items = "dict", list(obj.items())
    elif isinstance(obj, (list, tuple)) and obj:
        container, items = "list", list(enumerate(obj))
    else:
        return None
    for _k, t in items:
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized:
            return None
    return container, items


def _describe(obj) -> str:
    return type(obj).__name__


def encode(obj: Any) -> _Payload:
    """The object as a codec header plus buffers, and for tensor containers a per-key description."""
    header, buffers = codec.encode(obj)
    buffers = [memoryview(b).cast("B") for b in buffers]
    meta = {"form": "object", "header": header, "sizes": [b.nbytes for b in buffers], "entries": None,
            "what": _describe(obj), "chunk": _chunk_bytes()}
    found = _tensor_items(obj)
    if found is not None:
        container, items = found
        index: dict[int, int] = {}
        entries = []
        for key, t in items:
            i = index.setdefault(id(t), len(index))
            entries.append((key, i, codec._dtype_name(t.dtype), tuple(t.shape)))
        sizes = meta["sizes"]
        nbytes = {i: t.numel() * t.element_size() for (_k, t), (_k2, i, _d, _s) in zip(items, entries)}
        if len(sizes) == len(index) and all(sizes[i] == n for i, n in nbytes.items()):
            meta.update(form="tensors", container=container, entries=entries)
    return _Payload(meta, buffers)


def _dumps(meta: dict) -> bytes:
    try:
        return pickle.dumps(meta, protocol=5)
    except Exception:  # keys of a class pickle cannot name
        import cloudpickle

        return cloudpickle.dumps(meta, protocol=5)


def _out_name(container: str, key) -> str:
    """How messages name one tensor of ``out``."""
    return "out=" if container == "tensor" else f"out[{key!r}]"


def _targets_for_out(out, meta: dict, me: str, private: bool = True) -> list:
    """For each buffer, the byte views of the ``out`` tensors it fills; raises before anything is written.

    ``private``: tensors on a shared segment get private memory first (``_unshare``), once all are checked:
    a copy into them must not reach the other receivers."""
    import numpy as np  # imported here: a process that never broadcasts does not load it
    torch = sys.modules.get("torch")
    entries = meta.get("entries")
    if entries is None:
        raise ValueError(f"{me}: broadcast(out=...) needs the source to broadcast a tensor, or a dict, list or tuple "
                         f"of CPU tensors; it broadcast a {meta.get('what')}")
    container = meta["container"]
    if container == "dict":
        if not isinstance(out, dict):
            raise TypeError(f"{me}: broadcast(out=...): the source broadcast a dict of tensors, out= is a "
                            f"{type(out).__name__}")
        keys = [e[0] for e in entries]
        missing = [k for k in keys if k not in out]
        extra = [k for k in out if k not in set(keys)]
        if missing or extra:
            raise ValueError(f"{me}: broadcast(out=...): the keys differ from the source's: missing in out= "
                             f"{missing[:8]}, not sent by the source {extra[:8]}")
    elif container == "list":
        if not isinstance(out, (list, tuple)) or len(out) != len(entries):
            raise ValueError(f"{me}: broadcast(out=...): the source broadcast a list of {len(entries)} tensors, out= "
                             f"is a {type(out).__name__}"
                             f"{f' of {len(out)}' if isinstance(out, (list, tuple)) else ''}")
    targets: list = [[] for _ in meta["sizes"]]
    for key, i, dtype, shape in entries:
        t = out if container == "tensor" else out[key]
        name = _out_name(container, key)
        if torch is None or not isinstance(t, torch.Tensor):
            raise TypeError(f"{me}: broadcast: {name} is a {type(t).__name__}, not a tensor")
        if codec._dtype_name(t.dtype) != dtype or tuple(t.shape) != tuple(shape):
            raise ValueError(f"{me}: broadcast: {name} is a {tuple(t.shape)} {codec._dtype_name(t.dtype)} tensor, "
                             f"the source sent {tuple(shape)} {dtype}")
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"{me}: broadcast: {name} must be a contiguous CPU tensor")
        targets[i].append(np.frombuffer(codec.tensor_bytes(t), dtype=np.uint8) if t.numel() else None)
    if private and _unshare(out):  # moved: the byte views must be of their new memory
        return _targets_for_out(out, meta, me, private=False)
    return targets


def copy_into(obj: Any, out: Any, me: str) -> Any:
    """Copy a received object into ``out`` (the paths that did not receive into it directly)."""
    import numpy as np  # imported here: a process that never broadcasts does not load it
    meta = encode(obj).meta if _tensor_items(obj) is not None else {"entries": None, "what": _describe(obj),
                                                                       "sizes": []}
    targets = _targets_for_out(out, meta, me)
    for (key, i, _d, _s) in meta["entries"]:
        src = obj if meta["container"] == "tensor" else obj[key]
        if src.numel():
            src_bytes = np.frombuffer(codec.tensor_bytes(src.contiguous()), dtype=np.uint8)
            for dst in targets[i]:
                np.copyto(dst, src_bytes)
    return out


# -- failures -------------------------------------------------------------------------
def _failure(comm, addr_name: str, addr, exc: BaseException, what: str) -> dict:
    who = comm._describe(addr) if addr is not None else repr(addr_name)
    if isinstance(exc, CommunicationError):
        kind = "timeout" if isinstance(exc, TimeoutError) else "died" if isinstance(exc, PeerDiedError) else "refused"
        return {"who": addr_name, "kind": kind, "text": str(exc)}
    if isinstance(exc, TimeoutError):
        return {"who": addr_name, "kind": "timeout", "text": f"{what} {who} timed out"}
    if isinstance(exc, (ConnectionError, OSError)):
        return {"who": addr_name, "kind": "died", "text": f"{what} {who} failed: {exc}"}
    return {"who": addr_name, "kind": "refused", "text": f"{who}: {type(exc).__name__}: {exc}"}


def _raise(comm, errors: list, timeout: float) -> None:
    if not errors:
        return
    kinds = {e["kind"] for e in errors}
    cls = PeerDiedError if "died" in kinds else CommTimeoutError if "timeout" in kinds else CommunicationError
    from ...base.address import WorkerAddress

    names = "; ".join(comm._describe(WorkerAddress.from_name(n)) for n in sorted({e["who"] for e in errors}))
    text = "; ".join(e["text"] for e in errors[:8])
    raise cls(f"{comm.name}: broadcast (timeout {timeout:g} s) did not reach {names}: {text}", peer=errors[0]["who"])


class _Child:
    """A receiver we feed: its link, and the first failure seen on it (not raised: we keep serving the others)."""

    def __init__(self, comm, addr):
        self.comm, self.addr, self.name = comm, addr, addr.get_name()
        self.link = None
        self.error: Optional[dict] = None
        self.kept = False  # it keeps views of our segment (set by its acknowledgement)

    def join(self, state: _State, deadline: float) -> None:
        try:
            self.link = state.take(self.comm, self.addr, deadline)
        except Exception as exc:
            self.error = _failure(self.comm, self.name, self.addr, exc, "waiting for")

    def send(self, frames: list, deadline: float) -> None:
        if self.link is None:
            return
        try:
            self.link.send(frames, deadline)
        except Exception as exc:
            self._fail(exc, "sending to")

    def send_fds(self, frames: list, fds: list, deadline: float) -> None:
        if self.link is None:
            return
        try:
            self.link.send_fds(frames, fds, deadline)
        except Exception as exc:
            self._fail(exc, "sending to")

    def _fail(self, exc: BaseException, what: str) -> None:
        self.error = self.error or _failure(self.comm, self.name, self.addr, exc, what)
        link, self.link = self.link, None
        link.close()

    def acknowledgement(self, deadline: float) -> list:
        """The failures at and below this child (empty: all got it); closes the link."""
        self.kept = False
        if self.link is not None:
            try:
                _raw, frames = self.link.recv(deadline)
                # the link came from the cpu transport's listener: the peer passed the cluster-secret
                # handshake before any frame was read, so this unpickles only a cluster member's bytes
                ack = pickle.loads(bytes(frames[0]))
                errors, self.kept = ack["errors"], ack.get("kept", False)
            except Exception as exc:
                self._fail(exc, "waiting for the acknowledgement of")
            else:
                self.link.close()
                self.link = None
                return errors
        return [self.error] if self.error else []


# -- the plan ---------------------------------------------------------------------------
def _plan(comm, members: list, src) -> tuple[dict, dict]:
    """``(parent, child)`` by receiver name: whom each receiver connects to, and whom it feeds."""
    local_ok = os.environ.get(LOCAL_ENV, "1") != "0"

    def host(addr):
        return comm._lookup(addr).endpoints.get("cpu", {}).get("host")

    src_host = host(src)
    direct, chain = [], []
    for r in members:
        if r == src:
            continue
        h = host(r)
        (direct if local_ok and h == src_host else chain).append((h, r))
    order: dict = {}
    for h, _r in chain:
        order.setdefault(h, len(order))
    chain_addrs = [r for _h, r in sorted(chain, key=lambda e: order[e[0]])]
    parent = {r.get_name(): src for _h, r in direct}
    child: dict = {}
    prev = src
    for r in chain_addrs:
        parent[r.get_name()] = prev
        if prev != src:
            child[prev.get_name()] = r
        prev = r
    return parent, child


# -- the source ------------------------------------------------------------------------------
def _serve(comm, state: _State, obj, members, src, parent, deadline: float, timeout: float, fallback: bool,
           payload: Optional[_Payload] = None):
    import numpy as np  # imported here: a process that never broadcasts does not load it
    children = [_Child(comm, r) for r in members if r != src and parent[r.get_name()] == src]
    for c in children:
        c.join(state, deadline)
    if fallback:
        return _serve_p2p(comm, obj, members, src, children, deadline, timeout)
    try:
        if payload is None:
            payload = encode(obj)
    except Exception as exc:
        abort = _dumps({"form": "abort", "text": f"{comm.name} could not serialize the {_describe(obj)} it "
                                                  f"broadcast: {type(exc).__name__}: {exc}"})
        for c in children:
            c.send([abort], deadline)
        raise TypeError(f"{comm.name}: cannot broadcast {_describe(obj)}: {exc}") from exc
    meta, buffers = payload.meta, payload.buffers
    offsets, total = _layout(meta["sizes"])
    meta["chunk"] = _chunk_for(total, sum(1 for r in members if r != src and parent[r.get_name()] != src) + 1)
    meta_bytes = _dumps(meta)
    nbytes = len(meta["header"]) + total  # the payload, as a point-to-point send counts it
    shm_children = [c for c in children if c.link is not None and getattr(c.link, "local", False)]
    stream_children = [c for c in children if c.link is not None and c not in shm_children]
    threads = [threading.Thread(target=_feed, args=(c, meta_bytes, buffers, nbytes, meta["chunk"], None, deadline),
                                name="rlinf-broadcast-send", daemon=True) for c in stream_children]
    for t in threads:
        t.start()
    seg = None
    errors = []
    try:
        if shm_children:
            from ...transports.shm import DATA_OFFSET, parallel_copy

            seg = state.acquire_segment(max(total, 1))
            for b, off in zip(buffers, offsets):
                if b.nbytes:
                    parallel_copy(seg.view[DATA_OFFSET + off : DATA_OFFSET + off + b.nbytes], np.frombuffer(b, np.uint8))
            shm_meta = _dumps({**meta, "segment": DATA_OFFSET + seg.capacity, "token": seg.token, "uid": seg.uid,
                               "readers": len(shm_children)})
            for c in shm_children:
                _feed(c, shm_meta, buffers, nbytes, meta["chunk"], seg.fd, deadline)
        for c in shm_children:
            errors += c.acknowledgement(deadline)
        if seg is not None:  # never rewritten while a receiver may still read it or holds views of it
            # reused only when every receiver said how it left it: one that failed may still map it
            state.release_segment(seg, {c.name for c in shm_children if c.kept}, reusable=not errors)
            seg = None
            comm._start_housekeeping()  # trims the pool once broadcasts stop
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()) + 5.0)  # every send in _feed ends by the deadline
        for c in children:
            if c not in shm_children:
                errors += c.acknowledgement(deadline)
    finally:  # on an unexpected error: receivers see their link close at once, the segment is not reused
        if seg is not None:
            seg.close()
        for c in children:
            if c.link is not None:
                c.link.close()
    _raise(comm, errors, timeout)
    return obj


@hook("broadcast_feed")
def _feed(child: _Child, meta_bytes: bytes, buffers: list, nbytes: int, chunk: int, fd: Optional[int],
          deadline: float) -> None:
    """Give ``child`` the payload (``nbytes``: header and buffers): the segment it was written to (``fd``, a receiver on
    this host), or the stream of its chunks.  Failures stay on the child (``_Child.error``)."""
    if fd is not None:
        child.send_fds([meta_bytes], [fd], deadline)
        return
    child.send([meta_bytes], deadline)
    for b in buffers:
        for pos in range(0, b.nbytes, chunk):
            if child.link is None:
                return
            child.send([b[pos : pos + chunk]], deadline)


def _serve_p2p(comm, obj, members, src, children, deadline: float, timeout: float):
    """Objects holding device tensors: every receiver gets its copy point to point (device links)."""
    note = _dumps({"form": "p2p"})
    for c in children:
        c.send([note], deadline)
    left = max(0.001, deadline - time.monotonic())
    errors = []
    works = [(r, comm.send_object(obj, r, "cpu", left, True)) for r in members if r != src]
    for r, w in works:
        try:
            w.wait(max(0.001, deadline - time.monotonic()) + 5.0)  # the send itself ends by the deadline
        except Exception as exc:
            errors.append(_failure(comm, r.get_name(), r, exc, "sending to"))
    for c in children:
        errors += c.acknowledgement(deadline)
    _raise(comm, errors, timeout)
    return obj


# -- a receiver -------------------------------------------------------------------------------
def _receive(comm, state: _State, me_addr, members, src, parent, child_of, out, deadline: float, timeout: float,
             share_memory: bool = False):
    me = comm.name
    feeder = parent[me]
    try:
        link = state.connect(comm, feeder, deadline)
    except Exception as exc:
        err = _failure(comm, feeder.get_name(), feeder, exc, "connecting to")
        raise (PeerDiedError if err["kind"] == "died" else CommTimeoutError if err["kind"] == "timeout"
               else CommunicationError)(f"{me}: broadcast: {err['text']}", peer=feeder.get_name()) from None
    child = _Child(comm, child_of[me]) if me in child_of else None
    own_error: Optional[BaseException] = None
    result = None
    kept = False
    try:
        try:
            _raw, frames = link.recv(deadline)
            meta = pickle.loads(bytes(frames[0]))  # an authenticated link (see _Child.acknowledgement)
            form = meta["form"]
            if child is not None:
                child.join(state, deadline)
                child.send([frames[0]], deadline)
            if form == "abort":
                raise CommunicationError(f"{me}: broadcast: {meta['text']}", peer=src.get_name())
            if form == "p2p":
                left = max(0.001, deadline - time.monotonic())
                result = comm.recv_object(src, "cpu", left, False)
                if out is not None:
                    try:
                        result = copy_into(result, out, me)
                    except (TypeError, ValueError) as exc:
                        result, own_error = None, exc
            else:
                result, own_error, kept = _receive_payload(link, meta, child, out, me, deadline, state,
                                                           feeder.get_name(), share_memory)
                if state.mapped:
                    comm._start_housekeeping()  # drops the kept mapping once this feeder goes quiet
        except Exception as exc:  # the feeder failed us: nothing to acknowledge to
            state.forget_mapping(feeder.get_name())
            err = _failure(comm, feeder.get_name(), feeder, exc, "receiving the broadcast from")
            if child is not None and child.link is not None:
                child._fail(ConnectionError("the broadcast broke off upstream"), "feeding")
            cls = (PeerDiedError if err["kind"] == "died" else CommTimeoutError if err["kind"] == "timeout"
                   else CommunicationError)
            raise cls(f"{me}: broadcast from {src.get_name()!r}: {err['text']}", peer=feeder.get_name()) from None
        errors = child.acknowledgement(deadline) if child is not None else []
        if own_error is not None:
            errors.insert(0, {"who": me, "kind": "refused", "text": str(own_error)})
        try:
            link.send([pickle.dumps({"errors": errors, "kept": kept})], deadline)
        except Exception:
            pass  # the feeder is gone: it reports that itself
    finally:
        link.close()
    if own_error is not None:
        raise own_error
    return result


@hook("broadcast_take")
def _receive_payload(link, meta: dict, child: Optional[_Child], out, me: str, deadline: float, state: _State,
                     feeder: str, share_memory: bool = False):
    """Fill the destination from shared memory or from the stream; ``(result, refusal, kept)``.

    ``kept``: the result holds views of the source's segment (copy-on-write), or ``out``'s tensors were
    moved onto it (``share_memory``).
    """
    import numpy as np  # imported here: a process that never broadcasts does not load it
    from ...transports.shm import DATA_OFFSET, map_private, parallel_copy

    sizes = meta["sizes"]
    offsets, total = _layout(sizes)
    refusal = None
    targets = None
    sharing = share_memory and "segment" in meta
    if out is not None:
        try:
            targets = _targets_for_out(out, meta, me, private=not sharing)
        except (TypeError, ValueError) as exc:
            refusal = exc
    if "segment" in meta:  # the source wrote it once into a segment we share
        fds = link.take_fds()
        if not fds:
            raise ConnectionError("the shared-memory segment arrived without its descriptor")
        try:
            if refusal is not None:
                return None, refusal, False
            if targets is None:  # zero copies: views of a copy-on-write mapping
                buf = map_private(fds[0], meta["segment"])
                state.lend(feeder, meta.get("token"), buf)  # the source rewrites it only once the views are gone
                whole = np.frombuffer(buf, dtype=np.uint8)[DATA_OFFSET:]
                buffers = [whole[off : off + n] for off, n in zip(offsets, sizes)]
                return codec.decode(meta["header"], buffers), None, True
            mapping = state.shared_mapping(feeder, meta.get("uid"), fds[0], meta["segment"])
            whole = np.frombuffer(mapping, dtype=np.uint8)[DATA_OFFSET:]
            moved = False
            if sharing:  # no copy: out's tensors move onto the segment; only the ones torch cannot move are copied
                left, moved = _share(out, meta, mapping, [DATA_OFFSET + off for off in offsets], state, feeder, me)
                targets = [[] for _ in sizes]
                _unshare([t for _i, t in left])
                for i, t in left:
                    targets[i].append(np.frombuffer(codec.tensor_bytes(t), dtype=np.uint8))
            # several readers on one host share its cores already: each copies on its own thread then
            copy = parallel_copy if meta.get("readers", 1) == 1 else np.copyto
            for i, (off, n) in enumerate(zip(offsets, sizes)):
                for dst in targets[i]:
                    if dst is not None:
                        copy(dst, whole[off : off + n])
            return out, None, moved
        finally:
            for fd in fds:
                os.close(fd)
    flat = None
    if targets is None and refusal is None:
        flat = np.empty(total, dtype=np.uint8)
        targets = [[flat[off : off + n]] if n else [] for off, n in zip(offsets, sizes)]
    chunk = meta["chunk"]
    scratch = None
    for i, n in enumerate(sizes):
        dsts = [d for d in targets[i] if d is not None] if refusal is None else []
        for pos in range(0, n, chunk):
            m = min(chunk, n - pos)
            if dsts:
                first = dsts[0][pos : pos + m]
            else:  # refused: still take it off the wire and pass it on
                if scratch is None:
                    scratch = np.empty(chunk, dtype=np.uint8)
                first = scratch[:m]
            link.recv_into([first], deadline)
            if child is not None:
                child.send([first], deadline)
            for extra in dsts[1:]:
                np.copyto(extra[pos : pos + m], first)
    if refusal is not None:
        return None, refusal, False
    if out is not None:
        return out, None, False
    buffers = [flat[off : off + n] for off, n in zip(offsets, sizes)]
    return codec.decode(meta["header"], buffers), None, False


# -- receivers that share memory ------------------------------------------------------------------
#: the segments (one marker per lending) that tensors of this process were moved onto: a copy into such a
#: tensor would write memory other receivers read, so it is given private memory first (``_unshare``)
_SHARED: "weakref.WeakValueDictionary" = weakref.WeakValueDictionary()  # id -> marker (ctypes: unhashable)
_warned: set = set()


def _shared_ranges() -> list:
    """``(start, end)`` addresses of the segments tensors of this process were moved onto."""
    return [(m.lo, m.hi) for m in list(_SHARED.values())]


def _can_move(t, nbytes: int) -> bool:
    """Whether ``t``'s storage can be moved whole onto ``nbytes`` of the segment: ``t`` is all of its storage.

    Moving the storage, not re-pointing the tensor, is what reaches every alias of it: ``model.state_dict()``
    returns detached aliases of the parameters, and the parameters must see the new weights."""
    storage = t.untyped_storage()
    return (t.numel() > 0 and t.storage_offset() == 0 and t.is_contiguous() and storage.nbytes() == nbytes
            and hasattr(storage, "_swap_data_ptr_"))


def _share(out, meta: dict, mapping, offsets: list, state: _State, feeder: str, me: str) -> tuple[list, bool]:
    """Move the storage of each tensor of ``out`` onto its bytes in the segment ``mapping``.

    Returns ``([(buffer index, tensor)] still to be copied, whether any moved)``.  Every alias of a moved
    storage (a model's parameter behind its ``state_dict()`` entry) reads the new values; the old memory
    is freed with its last user.  The segment stays lent to this process (the source never writes it)
    until no storage here uses it: a marker object held by the moved storages reports it released."""
    import ctypes

    torch = sys.modules["torch"]
    sizes = meta["sizes"]
    container = meta["container"]
    marker = None
    left = []
    moved = False
    placed: set = set()  # buffers a storage was moved onto
    retired = []
    shared = _shared_ranges()
    for key, i, _dtype, _shape in meta["entries"]:
        t = out if container == "tensor" else out[key]
        if t.numel() == 0:
            continue
        where = ctypes.addressof(mapping) + offsets[i]
        if i in placed:
            if t.untyped_storage().data_ptr() != where:  # the source's tied buffer, two tensors here: kept apart
                left.append((i, t))
            continue  # else the same storage under another key (tied weights): moved already
        if not _can_move(t, sizes[i]):
            name = _out_name(container, key)
            if (me, name) not in _warned:
                _warned.add((me, name))
                import logging

                logging.getLogger("rlinf.broadcast").warning(
                    "%s: broadcast(share_memory=True) copies into %s: it is a view of a larger storage (or this "
                    "torch cannot move storages), so its memory cannot be shared", me, name)
            left.append((i, t))
            continue
        if marker is None:
            marker = (ctypes.c_char * ctypes.sizeof(mapping)).from_address(ctypes.addressof(mapping))
            marker.mapping = mapping  # the storages hold the marker, the marker holds the mapping
            marker.lo, marker.hi = ctypes.addressof(mapping), ctypes.addressof(mapping) + ctypes.sizeof(mapping)
            state.lend(feeder, meta.get("token"), marker)
            _SHARED[id(marker)] = marker
        region = torch.frombuffer(marker, dtype=torch.uint8, count=sizes[i], offset=offsets[i])
        old = t.untyped_storage().data_ptr()
        t.untyped_storage()._swap_data_ptr_(region.untyped_storage())  # its old memory goes with ``region``
        if not any(lo <= old < hi for lo, hi in shared):
            retired.append(region)  # private memory, freed at the next broadcast (a segment stays mapped)
        placed.add(i)
        moved = True
    with state.segment_lock:
        previous = state.retired.pop(feeder, None)
        if retired:
            state.retired[feeder] = retired
    del previous  # outside the lock: freeing it may run finalizers
    return left, moved


def _unshare(out) -> bool:
    """Give the tensors of ``out`` that live on a shared segment private memory (same values); True if any.

    Called before anything is copied into ``out``: other receivers read that segment."""
    if not _SHARED:
        return False
    ranges = _shared_ranges()
    torch = sys.modules["torch"]
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else [out]
    moved = False
    for t in values:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        where = storage.data_ptr()
        if any(lo <= where < hi for lo, hi in ranges):
            private = torch.empty(storage.nbytes(), dtype=torch.uint8).untyped_storage()
            private.copy_(storage)
            storage._swap_data_ptr_(private)
            moved = True
    return moved


# -- the entry point ----------------------------------------------------------------------------
def broadcast(comm, obj, members: list, src, out, transport: Optional[str], timeout: float, async_op: bool,
              share_memory: bool = False):
    """Run one broadcast in this process's turn; ``members`` and ``src`` are addresses."""
    state = getattr(comm, "broadcast_state", None)
    if state is None:
        raise CommunicationError(f"{comm.name}: this communicator does not serve broadcasts")
    me = comm.address
    ticket = state.turnstile.take()
    plan = _plan(comm, members, src)
    fallback = False
    eager = None
    if me == src:
        fallback = device_routing.may_hold_device_tensors(obj) and device_routing.needs_device_path(obj)
        if not fallback and not async_op and len(members) > 1:
            try:
                eager = _eager_payload(obj)
            except Exception:  # _serve encodes it again, tells the receivers, and raises
                eager = None

    def op():
        deadline = time.monotonic() + timeout
        try:
            state.turnstile.wait_turn(ticket, deadline)
            parent, child = plan
            if me == src:
                return _serve(comm, state, obj, members, src, parent, deadline, timeout, fallback, eager)
            return _receive(comm, state, me, members, src, parent, child, out, deadline, timeout, share_memory)
        except TimeoutError as exc:
            if isinstance(exc, CommunicationError):
                raise
            raise CommTimeoutError(f"{comm.name}: broadcast timed out after {timeout:g} s ({exc})") from None
        finally:
            state.turnstile.done(ticket)

    if async_op:
        return AsyncWork(state.runner.submit(op), "broadcast")
    if eager is not None:
        state.runner.submit(op).add_done_callback(lambda f: _log_eager_failure(comm, f))
        return obj
    return op()


def _log_eager_failure(comm, fut) -> None:
    """A small broadcast the source already returned from failed: nobody waits on it, so say so."""
    exc = fut.exception()
    if exc is not None:
        import logging

        logging.getLogger("rlinf.broadcast").error("%s: a broadcast it returned from early failed: %s", comm.name, exc)
