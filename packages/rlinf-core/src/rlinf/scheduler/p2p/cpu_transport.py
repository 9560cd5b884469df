"""The built-in CPU transport: sockets everywhere, shared memory on one host.

Peers on one host connect over a Unix socket (abstract namespace: no file to
clean up) and large buffers travel through ``memfd`` shared memory: one copy
on the sender, none on the receiver.  Peers on different hosts (or when
``RLINF_CPU_LOCAL=0``) connect over TCP and buffers travel inline.

Every connection starts with ``rlinf.scheduler.security``'s handshake (the
cluster secret, both ways) and the length-prefixed hello; only then does a
``SocketLink`` exist.

Wire format of one message::

    header  <BBHHH>   kind, flags, nframes, nnew, ndrop
    nnew  x <IxxxxQ>  new segment id, capacity   (fds ride along, SCM_RIGHTS)
    ndrop x <I>       segment ids the receiver may unmap
    nframes x <BxxxIQQ> where (0 inline, 1 shm), segment id, offset, length
    inline frame bytes, in order
"""

from __future__ import annotations

import array
import collections
import os
import select
import selectors
import socket
import struct
import threading
import time
import uuid
from typing import Callable, Optional, Sequence

from .. import security
from .transport import Link, Transport

LOCAL_ENV = "RLINF_CPU_LOCAL"
#: buffers at least this large go through shared memory (same host only)
SHM_MIN_ENV = "RLINF_CPU_SHM_MIN_BYTES"
#: microseconds a receive spins before sleeping (0: never spin)
SPIN_ENV = "RLINF_SPIN_US"

_HEADER = struct.Struct("<BBHHH")
_NEWSEG = struct.Struct("<IxxxxQ")
_DROP = struct.Struct("<I")
_FRAME = struct.Struct("<BxxxIQQ")
KIND_DATA = 1
FLAG_RAW = 1
INLINE, SHM = 0, 1
_CHUNK = 1 << 16
_ALIGN = 64
_MAX_FDS = 64


def _host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


def _remaining(deadline: Optional[float]) -> Optional[float]:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


def _spin_seconds() -> float:
    return max(0.0, float(os.environ.get(SPIN_ENV, "50"))) / 1e6


class SocketLink(Link):
    """One connected stream socket; shared memory when ``local``.

    The socket is non-blocking: a ready socket costs one system call, a
    waiting one spins for at most ``RLINF_SPIN_US`` microseconds (a reply
    often arrives within that, which saves a sleep and a wake-up) and then
    sleeps in ``poll`` until the deadline.
    """

    def __init__(self, sock: socket.socket, local: bool):
        self.sock = sock
        self.local = local
        sock.setblocking(False)
        self._fd = sock.fileno()
        self._poll_in = select.poll()
        self._poll_in.register(self._fd, select.POLLIN)
        self._poll_out = select.poll()
        self._poll_out.register(self._fd, select.POLLOUT)
        self._spin = _spin_seconds()
        self._shm_min = int(os.environ.get(SHM_MIN_ENV, str(1 << 16)))
        self._pool = self._cache = None
        if local:  # numpy and the segment code load only where shared memory is used
            from .shm import ReceiverCache, SenderPool

            self._pool, self._cache = SenderPool(), ReceiverCache()
        self._ancsize = socket.CMSG_SPACE(_MAX_FDS * 4) if local else 0
        self._rbuf = bytearray(_CHUNK)
        self._rview = memoryview(self._rbuf)
        self._rstart = 0
        self._rend = 0
        self._fds: list[int] = []
        self._broken: Optional[str] = None
        self._wlock = threading.Lock()
        self._rlock = threading.Lock()
        self._ahead_cond: Optional[threading.Condition] = None
        self._ahead_error: Optional[BaseException] = None
        self._ahead: "collections.deque" = collections.deque()

    def is_open(self) -> bool:
        return not self._broken and (self._ahead_cond is None or self._ahead_error is None or bool(self._ahead))

    # -- waiting ------------------------------------------------------------------
    def _wait(self, poller, deadline: Optional[float], spun: list) -> None:
        """Called after EAGAIN: spin once per operation, then sleep in poll until the deadline."""
        if not spun[0]:
            spun[0] = True
            if self._spin:
                end = time.perf_counter() + self._spin
                while time.perf_counter() < end:
                    if poller.poll(0):
                        return
        left = _remaining(deadline)
        # sleep in slices of at most a second, so a closed link is noticed
        if not poller.poll(1000 if left is None else max(1, int(min(left, 1.0) * 1000))):
            self._check()
            _remaining(deadline)  # raises once past the deadline

    # -- sending ------------------------------------------------------------
    def send(self, frames: Sequence, deadline: Optional[float], raw: bool = False) -> None:
        self._check()
        views = []
        for f in frames:
            v = f if isinstance(f, memoryview) else memoryview(f)
            if v.ndim != 1 or v.format != "B":
                v = v.cast("B")
            views.append(v)
        descs, inline, fds, newsegs, drops = [], [], [], [], []
        shm_min = self._shm_min
        seg = None
        if self.local and any(v.nbytes >= shm_min for v in views):
            import numpy as np

            from .shm import DATA_OFFSET, parallel_copy

            total = sum(-(-v.nbytes // _ALIGN) * _ALIGN for v in views if v.nbytes >= shm_min)
            seg, created = self._pool.acquire(total, deadline)
            if created:
                newsegs.append(_NEWSEG.pack(seg.seg_id, seg.capacity))
                fds.append(seg.fd)
            drops = [_DROP.pack(i) for i in self._pool.take_dropped()]
        offset = 0
        for v in views:
            n = v.nbytes
            if seg is not None and n >= shm_min:
                parallel_copy(seg.view[DATA_OFFSET + offset : DATA_OFFSET + offset + n], np.frombuffer(v, dtype=np.uint8))
                descs.append(_FRAME.pack(SHM, seg.seg_id, offset, n))
                offset += -(-n // _ALIGN) * _ALIGN
            else:
                descs.append(_FRAME.pack(INLINE, 0, 0, n))
                if n:
                    inline.append(v)
        header = b"".join(
            [_HEADER.pack(KIND_DATA, FLAG_RAW if raw else 0, len(views), len(newsegs), len(drops)), *newsegs, *drops, *descs]
        )
        with self._wlock:
            try:
                self._send_all([header, *inline], fds, deadline)
            except BaseException as exc:
                self._broken = f"a send failed midway ({type(exc).__name__})"
                raise
        if fds:
            self._pool.sent(seg)

    def _send_all(self, pending: list, fds: list[int], deadline: Optional[float]) -> None:
        sock = self.sock
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        spun = [False]
        while pending:
            try:
                sent = sock.sendmsg(pending[:512], anc)
            except (BlockingIOError, InterruptedError):
                self._wait(self._poll_out, deadline, spun)
                continue
            anc = []
            while sent and pending:
                head = pending[0]
                size = memoryview(head).nbytes
                if sent >= size:
                    sent -= size
                    pending.pop(0)
                else:
                    pending[0] = memoryview(head).cast("B")[sent:]
                    sent = 0

    # -- receiving ------------------------------------------------------------
    def _check(self) -> None:
        if self._broken:
            raise ConnectionError(f"the connection is unusable: {self._broken}")

    def _eof(self, midway: bool):
        self._broken = "the peer closed the connection"
        where = " mid-message" if midway else ""
        raise ConnectionError(f"the peer closed the connection{where} (its process may have died)")

    def _fill(self, deadline: Optional[float]) -> None:
        """Read more bytes into the buffer (compacting it first)."""
        if self._rstart:
            n = self._rend - self._rstart
            self._rbuf[:n] = self._rbuf[self._rstart : self._rend]
            self._rstart, self._rend = 0, n
        if self._rend == len(self._rbuf):  # grow into a new buffer: views of the old one stay valid
            bigger = bytearray(2 * len(self._rbuf))
            bigger[: self._rend] = self._rbuf[: self._rend]
            self._rbuf, self._rview = bigger, memoryview(bigger)
        view = self._rview[self._rend :]
        spun = [False]
        while True:
            try:
                if self.local:
                    n, anc, _flags, _ = self.sock.recvmsg_into([view], self._ancsize)
                    for level, kind, data in anc:
                        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                            fds = array.array("i")
                            fds.frombytes(data[: len(data) - len(data) % 4])
                            self._fds.extend(fds)
                else:
                    n = self.sock.recv_into(view)
                break
            except (BlockingIOError, InterruptedError):
                self._wait(self._poll_in, deadline, spun)
        if n == 0:
            self._eof(False)
        self._rend += n

    def _take(self, n: int, deadline: Optional[float]) -> memoryview:
        while self._rend - self._rstart < n:
            self._fill(deadline)
        view = self._rview[self._rstart : self._rstart + n]
        self._rstart += n
        return view

    def _read_into(self, target: memoryview, deadline: Optional[float]) -> None:
        have = min(self._rend - self._rstart, target.nbytes)
        if have:
            target[:have] = self._rview[self._rstart : self._rstart + have]
            self._rstart += have
        pos = have
        spun = [False]
        while pos < target.nbytes:
            try:
                n = self.sock.recv_into(target[pos:])
            except (BlockingIOError, InterruptedError):
                self._wait(self._poll_in, deadline, spun)
                continue
            if n == 0:
                self._eof(True)
            pos += n

    def _read_message_head(self, deadline: Optional[float]):
        self._check()
        kind, flags, nframes, nnew, ndrop = _HEADER.unpack(self._take(_HEADER.size, deadline))
        # the message has started: finish it even if the deadline passes, or the stream is lost
        if kind != KIND_DATA:
            self._broken = f"unexpected message kind {kind}"
            raise ConnectionError(self._broken)
        body = self._take(nnew * _NEWSEG.size + ndrop * _DROP.size + nframes * _FRAME.size, None)
        pos = 0
        for _ in range(nnew):
            seg_id, capacity = _NEWSEG.unpack_from(body, pos)
            pos += _NEWSEG.size
            if not self._fds:
                self._broken = "a shared-memory segment arrived without its descriptor"
                raise ConnectionError(self._broken)
            self._cache.add(seg_id, self._fds.pop(0), capacity)
        for _ in range(ndrop):
            self._cache.drop(_DROP.unpack_from(body, pos)[0])
            pos += _DROP.size
        frames = [_FRAME.unpack_from(body, pos + i * _FRAME.size) for i in range(nframes)]
        return bool(flags & FLAG_RAW), frames

    # -- read-ahead (network links) ----------------------------------------------
    def start_read_ahead(self, budget: int = 64 << 20) -> None:
        """Read incoming messages on a thread, up to ``budget`` bytes ahead of the user.

        Used on TCP links, where a large message cannot go through shared
        memory: without it, two workers that both send a large message before
        receiving would wait on each other forever.
        """
        self._spin = 0.0
        self._ahead: "collections.deque" = collections.deque()
        self._ahead_bytes = 0
        self._ahead_budget = budget
        self._ahead_error: Optional[BaseException] = None
        self._ahead_cond = threading.Condition()
        threading.Thread(target=self._read_ahead_loop, name="rlinf-cpu-read-ahead", daemon=True).start()

    def _read_ahead_loop(self) -> None:
        while True:
            with self._ahead_cond:
                while self._ahead_bytes >= self._ahead_budget and not self._broken:
                    self._ahead_cond.wait(1.0)
            try:
                raw, frames = self._recv_direct(None)
            except BaseException as exc:
                with self._ahead_cond:
                    self._ahead_error = exc
                    self._ahead_cond.notify_all()
                return
            size = sum(len(f) for f in frames)
            with self._ahead_cond:
                self._ahead.append((raw, frames, size))
                self._ahead_bytes += size
                self._ahead_cond.notify_all()

    def _pop_ahead(self, deadline: Optional[float]) -> tuple[bool, list]:
        with self._ahead_cond:
            while not self._ahead:
                if self._ahead_error is not None:
                    err = self._ahead_error
                    raise err if isinstance(err, ConnectionError) else ConnectionError(str(err))
                left = _remaining(deadline)
                self._ahead_cond.wait(1.0 if left is None else min(left, 1.0))
            raw, frames, size = self._ahead.popleft()
            self._ahead_bytes -= size
            self._ahead_cond.notify_all()
            return raw, frames

    def recv(self, deadline: Optional[float]) -> tuple[bool, list]:
        if self._ahead_cond is not None:
            return self._pop_ahead(deadline)
        return self._recv_direct(deadline)

    def _recv_direct(self, deadline: Optional[float]) -> tuple[bool, list]:
        with self._rlock:
            raw, frames = self._read_message_head(deadline)
            try:
                out = []
                shm = [(seg, off, n) for where, seg, off, n in frames if where == SHM]
                whole = None
                if shm:
                    seg_id = shm[0][0]
                    end = max(off + n for _, off, n in shm)
                    whole = self._cache.view(seg_id, 0, end)
                for where, seg_id, off, n in frames:
                    if where == SHM:
                        out.append(whole[off : off + n])
                    elif n <= self._rend - self._rstart:  # already buffered: one copy
                        out.append(bytearray(self._take(n, None)))
                    else:
                        buf = bytearray(n)
                        self._read_into(memoryview(buf), None)
                        out.append(buf)
                return raw, out
            except BaseException as exc:
                self._broken = self._broken or f"a receive failed midway ({type(exc).__name__})"
                raise

    def recv_into(self, targets: Sequence, deadline: Optional[float]) -> bool:
        if self._ahead_cond is not None:
            raw, frames = self._pop_ahead(deadline)
            views = [memoryview(t).cast("B") for t in targets]
            sizes = [len(f) for f in frames]
            if sizes != [v.nbytes for v in views]:
                raise ValueError(f"the message holds buffers of {sizes} bytes, the receiver offered {[v.nbytes for v in views]}")
            for v, f in zip(views, frames):
                v[:] = f
            return raw
        with self._rlock:
            raw, frames = self._read_message_head(deadline)
            views = [memoryview(t).cast("B") for t in targets]
            sizes = [n for _, _, _, n in frames]
            mismatch = len(sizes) != len(views) or any(n != v.nbytes for n, v in zip(sizes, views))
            try:
                for i, (where, seg_id, off, n) in enumerate(frames):
                    if where == SHM:
                        if mismatch:
                            self._cache.release(seg_id)
                        else:
                            self._cache.copy_out(seg_id, off, n, views[i])
                    elif mismatch:
                        self._read_into(memoryview(bytearray(n)), None)  # consume and discard
                    elif n:
                        self._read_into(views[i], None)
            except BaseException as exc:
                self._broken = self._broken or f"a receive failed midway ({type(exc).__name__})"
                raise
            if mismatch:
                raise ValueError(f"the message holds buffers of {sizes} bytes, the receiver offered {[v.nbytes for v in views]}")
            return raw

    def close(self) -> None:
        self._broken = self._broken or "closed"
        try:
            self.sock.close()
        except OSError:
            pass
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        if self._pool is not None:
            self._pool.close()
        if self._cache is not None:
            self._cache.close()


def _tune(sock: socket.socket, tcp: bool) -> None:
    if tcp:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        except OSError:
            pass


class _TrackedLink(SocketLink):
    """A ``SocketLink`` that tells its transport when it is closed, so the transport forgets it."""

    _forget: Optional[Callable] = None

    def close(self) -> None:
        try:
            super().close()
        finally:
            forget, self._forget = self._forget, None
            if forget is not None:
                forget(self)


class CpuTransport(Transport):
    """Listens on TCP and an abstract Unix socket; every connection is authenticated first.

    Accepted connections go through a ``security.HandshakeGate`` (peer uid on
    the Unix socket, the cluster-secret challenge both ways, a bounded hello,
    all under the handshake deadline) before a link exists; outgoing ones run
    ``security.client_handshake``.  Once per link: messages pay nothing.
    """

    name = "cpu"

    def __init__(self):
        self._listeners: list[socket.socket] = []
        self._selector: Optional[selectors.BaseSelector] = None
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._on_accept: Optional[Callable] = None
        self._gate: Optional[security.HandshakeGate] = None
        self._links: set[_TrackedLink] = set()  # open links only: a closed one is forgotten
        self._lock = threading.Lock()

    def listen(self, on_accept, local_ip: str) -> dict:
        security.cluster_secret()  # a bad RLINF_CLUSTER_SECRET fails here, before anything listens
        self._on_accept = on_accept
        self._gate = security.HandshakeGate(self._authenticated, name="rlinf-cpu")
        tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tcp.bind((local_ip, 0))
        tcp.listen(128)
        unix_name = f"\0rlinf-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(unix_name)
        unix.listen(128)
        self._listeners = [tcp, unix]
        self._selector = selectors.DefaultSelector()
        for s in self._listeners:
            s.setblocking(False)
            self._selector.register(s, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._accept_loop, name="rlinf-cpu-accept", daemon=True)
        self._thread.start()
        return {
            "tcp": [local_ip, tcp.getsockname()[1]],
            "unix": unix_name[1:],
            "host": _host_id(),
            "pid": os.getpid(),
        }

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                events = self._selector.select(timeout=0.5)
            except (OSError, ValueError):
                return
            for key, _ in events:
                try:
                    conn, _ = key.fileobj.accept()
                except OSError:
                    continue
                self._gate.admit(conn)  # bounded: never more than a few dozen handshakes in flight

    def _authenticated(self, conn: socket.socket, hello: bytes) -> None:
        """Called by the gate once the peer proved it holds the cluster secret and sent its hello."""
        is_tcp = conn.family == socket.AF_INET
        _tune(conn, is_tcp)
        link = self._track(_TrackedLink(conn, local=not is_tcp))
        if is_tcp:
            link.start_read_ahead()
        self._on_accept(link, hello)

    def _track(self, link: _TrackedLink) -> _TrackedLink:
        link._forget = self._forget
        with self._lock:
            self._links.add(link)
        return link

    def _forget(self, link: _TrackedLink) -> None:
        with self._lock:
            self._links.discard(link)

    def _use_local(self, endpoint: dict) -> bool:
        return os.environ.get(LOCAL_ENV, "1") != "0" and endpoint.get("host") == _host_id()

    def connect(self, endpoint: dict, hello: bytes, deadline: Optional[float]) -> Link:
        sock = None
        if self._use_local(endpoint):
            try:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(_remaining(deadline))
                sock.connect("\0" + endpoint["unix"])
                local = True
            except OSError:
                sock.close()
                sock = None  # another network namespace: fall back to TCP
        if sock is None:
            host, port = endpoint["tcp"]
            sock = socket.create_connection((host, port), timeout=_remaining(deadline))
            local = False
        try:
            _tune(sock, not local)
            # bounded by the handshake timeout even when the operation has no deadline
            limit = security.handshake_deadline(deadline)
            security.client_handshake(sock, limit)
            security.send_hello(sock, hello, limit)
        except BaseException:
            sock.close()
            raise
        return self._track(_TrackedLink(sock, local=local))

    def probe(self, endpoint: dict) -> bool:
        if endpoint.get("host") == _host_id():
            try:
                os.kill(int(endpoint["pid"]), 0)
                return True
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
        try:  # a connection that is accepted and dropped unauthenticated: enough to tell the port is served
            socket.create_connection(tuple(endpoint["tcp"]), timeout=2.0).close()
            return True
        except ConnectionRefusedError:
            return False
        except OSError:
            return True

    def close(self) -> None:
        self._stop.set()
        for s in self._listeners:
            try:
                s.close()
            except OSError:
                pass
        if self._gate is not None:
            self._gate.close()
        with self._lock:
            links, self._links = list(self._links), set()
        for link in links:
            link.close()
