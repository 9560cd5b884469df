"""The built-in CPU transport: sockets everywhere, shared memory on one host.

Peers on one host connect over a Unix socket (abstract namespace: no file to
clean up) and large buffers travel through ``memfd`` shared memory: one copy
on the sender, none on the receiver.  Peers on different hosts (or when
``RLINF_CPU_LOCAL=0``) connect over TCP and buffers travel inline.

Every connection starts with ``rlinf.scheduler.base.security``'s handshake (the
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
import fcntl
import os
import select
import selectors
import socket
import struct
import threading
import termios
import time
import uuid
from typing import Callable, Optional, Sequence

from ..base import security
from ..plugins.transport import READ_AHEAD_MESSAGE_COST, Link, LinkBusy, LinkClosed, Transport

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
#: TCP keepalive: probe an idle peer after this many seconds, then every interval, giving up after count
KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 15, 5, 4
_ALIGN = 64
_MAX_FDS = 64


def _host_id() -> str:
    """Who can reach this process's abstract Unix socket: same boot, same hostname, same network namespace.

    Abstract Unix sockets belong to a network namespace, so containers or
    namespaces on one machine are different hosts here: their links go over
    TCP (and their liveness is probed through it) rather than failing over.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    try:
        netns = os.readlink("/proc/self/ns/net")  # "net:[4026531840]"
    except OSError:
        netns = "?"
    return f"{socket.gethostname()}/{boot}/{netns}"


#: seconds a probe of a peer's listener may take, connection and handshake together
PROBE_TIMEOUT = 2.0


def _pid_namespace() -> Optional[str]:
    """This process's pid namespace (``"pid:[4026531836]"``): where a published pid means the same process."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _start_ticks(pid: int) -> Optional[int]:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22); None if it has
    ended (a zombie included); ``-1`` if it runs but its start cannot be read (``/proc`` mounted hidepid)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold anything
    except FileNotFoundError:
        try:  # hidden (hidepid), or really gone
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass
        return -1
    except OSError:
        return -1
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _process_identity() -> dict:
    """The endpoint's fields that name this process on its host: pid, pid namespace, start time.

    A pid alone is reused once the process ends; with its start time it is not.
    """
    ident = {"pid": os.getpid()}
    started = _start_ticks(os.getpid())
    if started is not None and started >= 0:
        ident["started"] = started
        ident["pidns"] = _pid_namespace()
    return ident


def _process_alive(endpoint: dict) -> Optional[bool]:
    """Whether the endpoint's process still runs, told by its pid: None where the pid cannot tell.

    It can on the same host (``_host_id``) and in the same pid namespace, where the pid names
    the process only together with its start time: a process that got the pid since is
    another.  Elsewhere (another host, network or pid namespace, or a start time that cannot be
    read) only the listener can say (``_listener_proves_itself``).
    """
    if endpoint.get("host") != _host_id() or endpoint.get("pidns", _pid_namespace()) != _pid_namespace():
        return None
    try:
        started = _start_ticks(int(endpoint["pid"]))
    except (KeyError, TypeError, ValueError):
        return None
    if started is None:
        return False
    if started < 0:
        return None
    return "started" not in endpoint or endpoint["started"] == started  # without it (an older rlinf): the pid alone


def _listener_proves_itself(endpoint: dict) -> bool:
    """Run the client handshake with the endpoint's TCP listener, sending no hello, within ``PROBE_TIMEOUT``.

    The peer is alive if the listener proves it holds the cluster secret and is the listener
    the endpoint named (its id is in the proofs), and dead if it refuses the connection,
    answers as something else, or proves itself wrongly: a process (rlinf or not) that took
    over a dead peer's port is not the peer.  Where the truth is unknown the peer counts as
    alive and the caller probes again later, as it did when any accepted connection counted:
    a connection or handshake that times out, is reset, or ends before the handshake began
    (a busy listener sheds connections that way, and may be slower than the probe to begin).
    So a process on another host that holds a dead peer's port and never speaks still looks
    alive until the waiting operation's own deadline.  The listener drops the connection once
    no hello follows; it logs that at DEBUG level.
    """
    deadline = time.monotonic() + PROBE_TIMEOUT
    try:
        sock = socket.create_connection(tuple(endpoint["tcp"]), timeout=PROBE_TIMEOUT)
    except ConnectionRefusedError:
        return False
    except OSError:  # unreachable, or no answer in time: unknown
        return True
    try:
        security.client_handshake(sock, deadline, listener=endpoint.get("listener", ""))
        return True
    except security.NotTaken:  # silent, shed, or slow: unknown
        return True
    except security.HandshakeError:  # refused us, another program, or another secret: not the peer
        return False
    except OSError:
        return True
    finally:
        sock.close()


#: frames at least this large are received into memory that is not zero-filled first
_LAZY_BUFFER = 1 << 20


def _receive_buffer(n: int):
    """A writable buffer of ``n`` bytes, owned by the receiver, for a frame read from the socket.

    A large one is a numpy array, which is not zero-filled (``bytearray(n)`` is): filling touches
    every fresh page before the first byte is read, and each first touch is a page fault (2.3 us
    on a test virtual machine: 0.6 s of CPU for 1 GiB), so a receiver would read nothing, and its
    sender see no progress, for that long; untouched, fresh pages are faulted in as the bytes
    land, and memory the allocator reuses is not written twice.  Filling a buffer measured there:
    np.empty 44-81 GB/s up to 16 MiB and 2.2 GB/s at 256 MiB, bytearray 13-47 and 1.9 GB/s, a
    fresh anonymous mapping 1.4-1.5 GB/s."""
    if n < _LAZY_BUFFER:
        return bytearray(n)
    import numpy as np

    return np.empty(n, dtype=np.uint8)


def _remaining(deadline: Optional[float]) -> Optional[float]:
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("deadline passed")
    return left


#: the largest message ``SocketLink.send_now`` sends (a quarter of the smallest default Unix socket buffer)
SEND_NOW_MAX = 32 << 10


def _spin_seconds() -> float:
    return max(0.0, float(os.environ.get(SPIN_ENV, "50"))) / 1e6


class _Partial:
    """A message whose head has been read but whose inline frames are still arriving.

    Kept on the link when a receive's deadline passes mid-message, so the next
    receive resumes where that one stopped: a deadline never costs the stream.
    """

    __slots__ = ("raw", "frames", "out", "index", "pos", "shm")

    def __init__(self, raw: bool, frames: list):
        self.raw = raw
        self.frames = frames  # (where, seg_id, offset, length)
        self.shm = None  # one view of the segment, sliced for every shared-memory frame
        self.out: list = []  # finished buffers, one per frame so far
        self.index = 0  # frame being read
        self.pos = 0  # bytes of it read so far (into out[index])


class SocketLink(Link):
    """One connected stream socket; shared memory when ``local``.

    The socket is non-blocking: a ready socket costs one system call, a
    waiting one spins for at most ``RLINF_SPIN_US`` microseconds (a reply
    often arrives within that, which saves a sleep and a wake-up) and then
    sleeps in ``poll`` until the deadline.

    Failure semantics (what core relies on):

    * A send whose deadline passes before any byte of the message left keeps
      the link usable.  A send that fails midway shuts the socket down for
      writing, so the receiver reads every earlier message, then an end of
      stream that tells it to discard the torn one.
    * A receive whose deadline passes, mid-message or not, keeps what it read
      for the next receive.  Its deadline bounds the call even while bytes keep
      arriving (checked after each read), so a long message under short
      deadlines arrives over several receives.
    * A receive raises ``EOFError``-flavoured ``ConnectionError``
      (``LinkClosed``) only once every complete message the peer sent has
      been delivered.
    """

    def __init__(self, sock: socket.socket, local: bool):
        self.sock = sock
        self.local = local
        sock.setblocking(False)
        if not local:
            _keepalive(sock)
        self._fd = sock.fileno()
        self._poll_in = select.poll()
        self._poll_in.register(self._fd, select.POLLIN)
        self._poll_out = select.poll()
        self._poll_out.register(self._fd, select.POLLOUT)
        self._spin = _spin_seconds()
        self._reads_bounded = True  # a receive's deadline ends it between reads too (off in recv_nowait)
        self._shm_min = int(os.environ.get(SHM_MIN_ENV, str(1 << 16)))
        self._pool = self._cache = None
        if local:  # numpy and the segment code load only where shared memory is used
            from .shm import ReceiverCache, SenderPool

            self._pool, self._cache = SenderPool(), ReceiverCache()
        self._ancsize = socket.CMSG_SPACE(_MAX_FDS * 4) if local else 0
        self._send_now_max = min(SEND_NOW_MAX, sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) // 4) if local else 0
        self._rbuf = bytearray()  # grown on the first receive: a link that only sends never pays for it
        self._rview = memoryview(self._rbuf)
        self._rstart = 0
        self._rend = 0
        self._received = False  # any byte yet: see _fill on resets
        self._fds: list[int] = []
        self._partial: Optional[_Partial] = None
        self._wbroken: Optional[str] = None  # why no more messages can be sent
        self._rbroken: Optional[str] = None  # why no more messages can be received
        self._wlock = threading.RLock()  # send_now holds it around send
        self._moved_at = 0.0  # when bytes last moved either way (see last_progress)
        self._outq = 0  # bytes sent the peer had not taken, when last_progress last looked
        self._rlock = threading.Lock()
        self._ahead_cond: Optional[threading.Condition] = None
        self._ahead_error: Optional[BaseException] = None
        self._ahead: "collections.deque" = collections.deque()
        self._on_close: list[Callable[["SocketLink"], None]] = []
        self._owed: Optional[bytes] = None  # bytes the peer must read before anything we send (see owe)

    def is_open(self) -> bool:
        return self._wbroken is None and self._rbroken is None

    def peer_closed(self) -> bool:
        """True once the peer closed the connection and nothing it sent is left to receive.

        Never blocks and never consumes data; ``False`` while a receive is
        under way on another thread.
        """
        if self._ahead_cond is not None:
            with self._ahead_cond:
                return self._ahead_error is not None and not self._ahead
        if self._rbroken is not None:
            return True
        if self._partial is not None or self._rend != self._rstart:
            return False
        if not self._rlock.acquire(blocking=False):
            return False
        try:
            if not self._poll_in.poll(0):
                return False
            try:
                return self.sock.recv(1, socket.MSG_PEEK) == b""
            except (BlockingIOError, InterruptedError):
                return False
            except OSError:
                return True
        finally:
            self._rlock.release()

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
        # sleep in slices of at most a second, so a link closed under us is noticed
        if not poller.poll(1000 if left is None else max(1, int(min(left, 1.0) * 1000))):
            if self.sock.fileno() < 0:
                raise ConnectionError("the link was closed")
            _remaining(deadline)  # raises once past the deadline

    # -- sending ------------------------------------------------------------
    def owe(self, data: bytes) -> None:
        """``data`` goes out first: with the next send, or by ``settle``, whichever comes first."""
        self._owed = data

    def settle(self, deadline: Optional[float]) -> None:
        """Send what is owed now, if no send did yet; a failure shows as the link's end to the peer."""
        try:
            self._send_message([], [], deadline)  # an empty message: what is owed goes first
        except (OSError, TimeoutError):  # LinkBusy included: that send pays what is owed first
            pass

    def _pay_owed(self, deadline: Optional[float]) -> None:  # under _wlock
        owed = self._owed
        if owed:
            self._send_all([owed], [], deadline, [0])  # one byte: sent whole or not at all
        self._owed = None

    def send(self, frames: Sequence, deadline: Optional[float], raw: bool = False) -> None:
        if self._wbroken is not None:
            raise ConnectionError(f"the connection is unusable: {self._wbroken}")
        views = []
        for f in frames:
            v = f if isinstance(f, memoryview) else memoryview(f)
            if v.ndim != 1 or v.format != "B":
                v = v.cast("B")
            views.append(v)
        descs, inline, fds, newsegs, drops = [], [], [], [], []
        shm_min = self._shm_min
        seg = created = None
        if self.local and any(v.nbytes >= shm_min for v in views):
            total = sum(-(-v.nbytes // _ALIGN) * _ALIGN for v in views if v.nbytes >= shm_min)
            got = self._pool.acquire(total)
            if got is not None:  # else the receiver holds too much of ours: inline, never wait
                seg, created = got
                if created:
                    newsegs.append(_NEWSEG.pack(seg.seg_id, seg.capacity))
                    fds.append(seg.fd)
                drops = [_DROP.pack(i) for i in self._pool.take_dropped()]
        unsent = None if seg is None else lambda: self._pool.unsent(seg, created, [_DROP.unpack(d)[0] for d in drops])
        offset = 0
        if seg is not None:
            import numpy as np

            from .shm import DATA_OFFSET, parallel_copy
        try:
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
        except BaseException:  # an interrupt during the copy: the segment goes back
            if unsent is not None:
                unsent()
            raise
        header = b"".join(
            [_HEADER.pack(KIND_DATA, FLAG_RAW if raw else 0, len(views), len(newsegs), len(drops)), *newsegs, *drops, *descs]
        )
        self._send_message([header, *inline], fds, deadline, unsent)
        if fds:
            self._pool.sent(seg)

    def _send_message(self, pending: list, fds: list, deadline: Optional[float], unsent=None) -> None:
        """Send one message whole, after what is owed and after any other thread's send, waiting
        for that at most until ``deadline`` (``LinkBusy`` then).  ``unsent()`` is called if it
        fails with nothing of it sent.  A message that fails midway ends the stream here, so the
        receiver drops it and keeps the rest; so does an interrupt (``KeyboardInterrupt``) once
        the lock is held, as it may land after the kernel took bytes and before they were counted.

        The lock is taken and released without a gap where an interrupt could keep it held, or
        release a hold this thread had before (``send_now`` around ``send``), and with no object
        made per message (this is every message's path)."""
        lock = self._wlock
        held_before = lock._is_owned()
        got = False
        progress = [0]
        try:
            # deadline None: the caller asked to wait without limit, here as in the send itself; the
            # holder's send ends by its own deadline, or when the link fails
            got = lock.acquire(False) or (
                lock.acquire() if deadline is None else lock.acquire(timeout=max(0.0, deadline - time.monotonic())))
            if not got:
                raise LinkBusy("another send on this connection held it until the deadline")
            if self._owed is not None:
                self._pay_owed(deadline)
            self._send_all(pending, fds, deadline, progress)
        except BaseException as exc:
            if progress[0] or (got and not isinstance(exc, Exception)):
                self._wbroken = f"a send failed midway ({type(exc).__name__})"
                try:
                    self.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
            elif unsent is not None:
                unsent()
            raise
        finally:
            if got or (not held_before and lock._is_owned()):  # taken, though an interrupt came before `got` was set
                lock.release()

    def last_progress(self) -> float:
        """``Link.last_progress``: set when bytes are read, when a send that found the buffers full
        goes on, and when fewer of our bytes wait for the peer than when this last looked (the
        kernel's count, ``SIOCOUTQ``: the peer took some, though the sender may not yet be woken).
        Meant to be called now and then (a heartbeat): each call is one ``ioctl``."""
        try:
            queued = struct.unpack("i", fcntl.ioctl(self._fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        except OSError:  # closed
            return self._moved_at
        if queued < self._outq:
            self._moved_at = max(self._moved_at, time.monotonic())
        self._outq = queued
        return self._moved_at

    def send_now(self, frames: Sequence) -> bool:
        """``Link.send_now``: on a Unix socket, a message of at most ``SEND_NOW_MAX`` bytes (and a
        quarter of the socket's send buffer) while the socket polls writable.  The kernel reports a
        Unix stream socket writable only while at most a quarter of its send buffer is queued at the
        peer, so such a message is taken whole by one ``sendmsg`` (Linux's rule; where it does not
        hold, a partial send waits up to a second, then breaks the link).  Never on TCP, where
        writable promises only some room (a part sent would have to wait for the rest)."""
        if not self.local or self._wbroken is not None:
            return False
        total = 0
        for f in frames:
            total += f.nbytes if isinstance(f, memoryview) else memoryview(f).nbytes
        if total > self._send_now_max or total >= self._shm_min:
            return False
        if not self._wlock.acquire(blocking=False):
            return False  # another send is under way: it may be waiting
        try:
            if not self._poll_out.poll(0):
                return False
            self.send(frames, time.monotonic() + 1.0)  # cannot wait (see above): the deadline only bounds a surprise
            return True
        finally:
            self._wlock.release()

    def send_fds(self, inline: Sequence, fds: Sequence[int], deadline: Optional[float]) -> None:
        """Send ``inline`` frames with descriptors riding along (``SCM_RIGHTS``); the caller keeps its own.

        The receiver collects them with ``take_fds`` after receiving the
        message.  ``broadcast`` hands one shared-memory segment, written once,
        to several receivers this way.  Same-host links only.
        """
        if not self.local:
            raise ValueError("descriptors travel over same-host links only")
        if self._wbroken is not None:
            raise ConnectionError(f"the connection is unusable: {self._wbroken}")
        views = [memoryview(f).cast("B") for f in inline]
        descs = [_FRAME.pack(INLINE, 0, 0, v.nbytes) for v in views]
        header = b"".join([_HEADER.pack(KIND_DATA, 0, len(descs), 0, 0), *descs])
        self._send_message([header, *[v for v in views if v.nbytes]], list(fds), deadline)

    def take_fds(self) -> list[int]:
        """Descriptors that arrived with the messages received so far and no segment claimed; the caller owns them."""
        with self._rlock:
            fds, self._fds = self._fds, []
            return fds

    def _send_all(self, pending: list, fds: list[int], deadline: Optional[float], progress: list) -> None:
        sock = self.sock
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        spun = [False]
        waited = False
        while pending:
            try:
                sent = sock.sendmsg(pending[:512], anc)
            except (BlockingIOError, InterruptedError):
                self._wait(self._poll_out, deadline, spun)
                waited = True
                continue
            anc = []
            progress[0] += sent
            if waited:  # the buffers were full and the peer made room: it reads (bytes merely queued prove nothing)
                self._moved_at = time.monotonic()
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
    def _closed(self, midway: bool):
        self._rbroken = "the peer closed the connection"
        if midway:
            raise LinkClosed("the peer closed the connection mid-message (its process may have died, "
                             "or its send failed midway)")
        raise LinkClosed("the peer closed the connection (its process may have died)")

    def _reset_is_end(self) -> bool:
        """Whether a connection reset ends the stream like a close, with nothing lost.

        On a Unix socket every byte sent is already queued here, and read before
        the reset is reported.  On TCP only while no byte came: a sender that gave
        up on a connection the listener took late closes it, with the
        acknowledgement unread, before sending one, and that resets it; once
        bytes came, a reset may have discarded some the sender's kernel still
        held, which is an error."""
        return self.local or not self._received

    def _fill(self, deadline: Optional[float]) -> None:
        """Read more bytes into the buffer (compacting it first)."""
        if self._rstart:
            n = self._rend - self._rstart
            self._rbuf[:n] = self._rbuf[self._rstart : self._rend]
            self._rstart, self._rend = 0, n
        if self._rend == len(self._rbuf):  # grow into a new buffer: views of the old one stay valid
            bigger = bytearray(max(_CHUNK, 2 * len(self._rbuf)))
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
            except ConnectionResetError:
                if not self._reset_is_end():
                    raise
                n = 0
                break
        if n == 0:
            self._closed(self._rend != self._rstart)
        self._received = True
        self._rend += n
        self._moved_at = time.monotonic()

    def _ensure(self, n: int, deadline: Optional[float]) -> None:
        """Buffer at least ``n`` unread bytes; consumes nothing, so a timeout loses nothing."""
        while self._rend - self._rstart < n:
            self._fill(deadline)

    def _read_into(self, target: memoryview, pos: int, deadline: Optional[float], progress: list) -> None:
        """Fill ``target[pos:]``; ``progress[0]`` tracks how far it got, also when it raises."""
        have = min(self._rend - self._rstart, target.nbytes - pos)
        if have:
            target[pos : pos + have] = self._rview[self._rstart : self._rstart + have]
            self._rstart += have
            pos += have
            progress[0] = pos
        spun = [False]
        while pos < target.nbytes:
            try:
                n = self.sock.recv_into(target[pos:])
            except (BlockingIOError, InterruptedError):
                self._wait(self._poll_in, deadline, spun)
                continue
            except ConnectionResetError:
                if not self._reset_is_end():
                    raise
                n = 0
            if n == 0:
                self._closed(True)
            pos += n
            progress[0] = pos
            self._moved_at = now = time.monotonic()
            if deadline is not None and now >= deadline and pos < target.nbytes and self._reads_bounded:
                # the deadline bounds the call, also while bytes keep coming: a receiver
                # slower than its sender finds data at every read and never waits
                raise TimeoutError("deadline passed")

    def _read_head(self, deadline: Optional[float]) -> _Partial:
        """Parse the next message's head, consuming it only once all of it has arrived."""
        if self._rbroken is not None:
            raise LinkClosed(f"the connection is unusable: {self._rbroken}")
        self._ensure(_HEADER.size, deadline)
        kind, flags, nframes, nnew, ndrop = _HEADER.unpack_from(self._rbuf, self._rstart)
        if kind != KIND_DATA:
            self._rbroken = f"unexpected message kind {kind}"
            raise ConnectionError(self._rbroken)
        size = _HEADER.size + nnew * _NEWSEG.size + ndrop * _DROP.size + nframes * _FRAME.size
        self._ensure(size, deadline)
        pos = self._rstart + _HEADER.size
        self._rstart += size
        body = self._rbuf
        for _ in range(nnew):
            seg_id, capacity = _NEWSEG.unpack_from(body, pos)
            pos += _NEWSEG.size
            if not self._fds:
                self._rbroken = "a shared-memory segment arrived without its descriptor"
                raise ConnectionError(self._rbroken)
            self._cache.add(seg_id, self._fds.pop(0), capacity)
        for _ in range(ndrop):
            self._cache.drop(_DROP.unpack_from(body, pos)[0])
            pos += _DROP.size
        frames = [_FRAME.unpack_from(body, pos + i * _FRAME.size) for i in range(nframes)]
        return _Partial(bool(flags & FLAG_RAW), frames)

    def _finish(self, msg: _Partial, deadline: Optional[float]) -> tuple[bool, list]:
        """Read the rest of ``msg`` into buffers of its own; on a timeout or an interrupt (Ctrl-C in the
        reading thread) ``msg`` is kept to resume, so the next receive does not read its body as a header."""
        frames, out = msg.frames, msg.out
        try:
            while msg.index < len(frames):
                where, seg_id, off, n = frames[msg.index]
                if where == SHM:
                    if msg.shm is None:  # one view for all frames: the segment is FREE once all are gone
                        end = max(o + m for w, _s, o, m in frames if w == SHM)
                        msg.shm = self._cache.view(seg_id, 0, end)
                    out.append(msg.shm[off : off + n])
                elif len(out) == msg.index and n <= self._rend - self._rstart:  # already buffered: one copy
                    out.append(bytearray(self._rview[self._rstart : self._rstart + n]))
                    self._rstart += n
                else:
                    # a buffer per frame, made once: a receive that timed out before the frame's first
                    # byte made it already (pos 0 does not say whether one exists)
                    if len(out) == msg.index:
                        out.append(_receive_buffer(n))
                    progress = [msg.pos]
                    try:
                        self._read_into(memoryview(out[-1]), msg.pos, deadline, progress)
                    finally:
                        msg.pos = progress[0]
                msg.index += 1
                msg.pos = 0
        except BaseException as exc:
            if isinstance(exc, TimeoutError) or not isinstance(exc, Exception):
                self._partial = msg
            raise
        self._partial = None
        msg.shm = None
        return msg.raw, out

    def _next(self, deadline: Optional[float]) -> tuple[bool, list]:
        msg = self._partial or self._read_head(deadline)
        return self._finish(msg, deadline)

    # -- read-ahead (network links) ----------------------------------------------
    def start_read_ahead(self, budget: int = 64 << 20) -> None:
        """Read incoming messages ahead of the user, up to ``budget`` bytes, on the process's reader thread.

        Used on TCP links, where a large message cannot go through shared
        memory: without it, two workers that both send a large message before
        receiving would wait on each other forever.  One ``_Reader`` thread
        serves every such link of the process, so threads do not grow with
        peers.
        """
        self._spin = 0.0
        self._reads_bounded = False  # the reader takes what is there; receives wait in _pop_ahead
        self._ahead_bytes = 0
        self._ahead_budget = budget
        self._ahead_paused = False
        self._ahead_cond = threading.Condition()
        _reader().add(self)

    def _pump_ahead(self) -> bool:
        """Called by the reader thread when the socket is readable: take every message that is
        complete, without waiting.  Returns False once the link needs no more reading (ended,
        failed, or over its budget: ``_pop_ahead`` resumes it)."""
        while True:
            with self._ahead_cond:
                if self._ahead_bytes >= self._ahead_budget:
                    self._ahead_paused = True  # with the lock held: _pop_ahead adds it back only after this
                    _reader().remove(self)
                    return True
            try:
                with self._rlock:
                    # a deadline already passed: stops at the first wait, keeping a partial message for next time
                    raw, frames = self._next(time.monotonic())
            except TimeoutError:
                return True
            except BaseException as exc:
                with self._ahead_cond:
                    self._ahead_error = exc
                    self._ahead_cond.notify_all()
                return False
            size = sum(len(f) for f in frames) + READ_AHEAD_MESSAGE_COST  # empty messages count too: the budget bounds memory
            with self._ahead_cond:
                self._ahead.append((raw, frames, size))
                self._ahead_bytes += size
                self._ahead_cond.notify_all()

    def _pop_ahead(self, deadline: Optional[float]) -> tuple[bool, list]:
        with self._ahead_cond:
            while not self._ahead:
                if self._ahead_error is not None:  # only once everything read before it was taken
                    err = self._ahead_error
                    raise err if isinstance(err, ConnectionError) else LinkClosed(str(err))
                left = _remaining(deadline)
                self._ahead_cond.wait(1.0 if left is None else min(left, 1.0))
            raw, frames, size = self._ahead.popleft()
            self._ahead_bytes -= size
            resume = self._ahead_paused and self._ahead_bytes < self._ahead_budget
            if resume:
                self._ahead_paused = False
        if resume:
            _reader().add(self)
        return raw, frames

    def recv(self, deadline: Optional[float]) -> tuple[bool, list]:
        if self._ahead_cond is not None:
            return self._pop_ahead(deadline)
        with self._rlock:
            return self._next(deadline)

    def poll_fd(self) -> Optional[int]:
        """The socket, unless a read-ahead thread owns it (readiness then says nothing about messages)."""
        return self._fd if self._ahead_cond is None else None

    def recv_nowait(self) -> Optional[tuple[bool, list]]:
        """A complete message, or None without waiting or spinning; a message half read is kept for the next call."""
        with self._rlock:
            spin, self._spin = self._spin, 0.0
            bounded, self._reads_bounded = self._reads_bounded, False  # reads on while bytes are there
            try:
                return self._next(time.monotonic())  # a passed deadline: the first EAGAIN raises TimeoutError
            except TimeoutError:
                return None
            finally:
                self._spin, self._reads_bounded = spin, bounded

    def recv_into(self, targets: Sequence, deadline: Optional[float]) -> bool:
        views = [memoryview(t).cast("B") for t in targets]
        if self._ahead_cond is not None:
            return _fill_targets(*self._pop_ahead(deadline), views)
        with self._rlock:
            if self._partial is not None:  # an earlier receive timed out midway: finish that message first
                return _fill_targets(*self._finish(self._partial, deadline), views)
            msg = self._read_head(deadline)
            frames = msg.frames
            if len(frames) != len(views) or any(n != v.nbytes for (_, _, _, n), v in zip(frames, views)):
                return _fill_targets(*self._finish(msg, deadline), views)  # raises ValueError, message consumed
            # the fast path: straight into the caller's buffers, one copy
            shm_seg = None
            i = pos = 0
            try:
                for i, (where, seg_id, off, n) in enumerate(frames):
                    pos = 0
                    if where == SHM:
                        self._cache.copy_out(seg_id, off, n, views[i])
                        shm_seg = seg_id
                    elif n:
                        progress = [0]
                        try:
                            self._read_into(views[i], 0, deadline, progress)
                        finally:
                            pos = progress[0]
            except TimeoutError:
                # keep what arrived, in buffers of our own, for the next receive
                msg.out = [bytearray(views[j]) for j in range(i)]
                msg.out.append(_receive_buffer(frames[i][3]))
                msg.out[-1][:pos] = views[i][:pos]
                msg.index, msg.pos = i, pos
                self._partial = msg
                if shm_seg is not None and not any(w == SHM for w, _s, _o, _n in frames[i:]):
                    self._cache.release(shm_seg)  # else the resumed receive's view frees it
                raise
            if shm_seg is not None:  # only now: a later frame may share the segment
                self._cache.release(shm_seg)
            return msg.raw

    def add_close_callback(self, fn: Callable[["SocketLink"], None]) -> None:
        """Call ``fn(link)`` once when the link is closed (the transport forgets it then)."""
        self._on_close.append(fn)

    def close(self) -> None:
        self._wbroken = self._wbroken or "closed"
        self._rbroken = self._rbroken or "closed"
        if self._ahead_cond is not None:
            _reader().remove(self)  # before the descriptor is closed (and its number reused)
        try:
            self.sock.close()
        except OSError:
            pass
        if self._ahead_cond is not None:
            with self._ahead_cond:
                self._ahead_cond.notify_all()
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)
        if self._ahead_cond is None and self._rlock.acquire(blocking=False):
            try:  # no reader: the receive buffer goes now, not whenever the link object does
                self._rbuf = bytearray()
                self._rview = memoryview(self._rbuf)
                self._rstart = self._rend = 0
            finally:
                self._rlock.release()
        if self._pool is not None:
            self._pool.close()
        if self._cache is not None:
            self._cache.close()
        callbacks, self._on_close = self._on_close, []
        for fn in callbacks:
            fn(self)


class _Reader:
    """The process's one read-ahead thread: a selector over every TCP link that reads ahead.

    Registration and removal happen on the callers' threads under a lock
    (epoll allows that while the thread waits); the thread only waits and
    reads.  A link over its budget is removed until its user takes enough.
    """

    def __init__(self):
        self._selector = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def add(self, link: SocketLink) -> None:
        with self._lock:
            if link._rbroken is not None or link.sock.fileno() < 0:  # closing: close() sets _rbroken, then removes
                return
            try:
                self._selector.register(link.sock, selectors.EVENT_READ, link)
            except KeyError:
                pass  # already registered
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rlinf-cpu-reader", daemon=True)
                self._thread.start()

    def remove(self, link: SocketLink) -> None:
        with self._lock:
            try:
                self._selector.unregister(link.sock)
            except (KeyError, ValueError):
                pass

    def _run(self) -> None:
        while True:
            try:
                # bounded; a link registered meanwhile wakes the wait itself once it is readable (epoll)
                events = self._selector.select(timeout=1.0)
            except (OSError, ValueError):
                continue
            for key, _ in events:
                link = key.data
                if not link._pump_ahead():
                    self.remove(link)


_the_reader: Optional[_Reader] = None
_reader_lock = threading.Lock()


def _reader() -> _Reader:
    global _the_reader
    if _the_reader is None:
        with _reader_lock:
            if _the_reader is None:
                _the_reader = _Reader()
    return _the_reader


def _fill_targets(raw: bool, frames: list, views: list) -> bool:
    """Copy a whole received message into the caller's buffers, or raise ``ValueError`` if they do not fit."""
    sizes = [memoryview(f).nbytes for f in frames]
    if sizes != [v.nbytes for v in views]:
        raise ValueError(f"the message holds buffers of {sizes} bytes, the receiver offered {[v.nbytes for v in views]}")
    for v, f in zip(views, frames):
        v[:] = memoryview(f).cast("B")
    return raw


def _keepalive(sock: socket.socket) -> None:
    """Let the kernel notice a peer host that vanished (no FIN ever comes) within about a minute."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for opt, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                           ("TCP_KEEPCNT", KEEPALIVE_COUNT)):
            if hasattr(socket, opt):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    except OSError:
        pass


def _gone(endpoint: dict) -> None:
    """Raise ``ConnectionError`` (not ``NotTaken``, which is tried again) if the pid says the peer has ended."""
    if _process_alive(endpoint) is False:
        raise ConnectionError(f"the peer's process (pid {endpoint.get('pid')}) is gone")


def _tune(sock: socket.socket, tcp: bool) -> None:
    if tcp:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        except OSError:
            pass


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
        self._wakeup: Optional[tuple[int, int]] = None
        self._links: set[SocketLink] = set()  # open links only: a closed one is forgotten
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
        self._wakeup = os.pipe()  # close() writes to it, so the accept loop never outlives its transport
        self._selector.register(self._wakeup[0], selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._accept_loop, name="rlinf-cpu-accept", daemon=True)
        self._thread.start()
        return {
            "tcp": [local_ip, tcp.getsockname()[1]],
            "unix": unix_name[1:],
            "host": _host_id(),
            **_process_identity(),  # pid, pid namespace, start time: see probe
            "listener": self._gate.listener_id,  # bound into every handshake with this listener
        }

    def _accept_loop(self) -> None:
        """Accept until ``close``; the loop owns the selector and closes it on its way out.

        (Closing the selector from another thread while this one waits in it
        can leave this thread waiting on a reused descriptor, forever.)
        """
        try:
            while not self._stop.is_set():
                try:
                    events = self._selector.select(timeout=0.5)
                except (OSError, ValueError):
                    return
                for key, _ in events:
                    if key.fileobj == self._wakeup[0]:
                        return
                    try:
                        conn, _ = key.fileobj.accept()
                    except OSError:
                        continue
                    self._gate.admit(conn)  # bounded: never more than a few dozen unproven handshakes in flight
        finally:
            self._selector.close()
            with self._lock:  # close() writes to the pipe only while it is ours
                wakeup, self._wakeup = self._wakeup, None
            for fd in wakeup:
                os.close(fd)

    def _authenticated(self, conn: socket.socket, hello: bytes) -> None:
        """Called by the gate once the peer proved it holds the cluster secret and sent its hello."""
        is_tcp = conn.family == socket.AF_INET
        _tune(conn, is_tcp)
        link = self._track(SocketLink(conn, local=not is_tcp))
        # the acknowledgement the connecting side waits for (security.await_accepted): sent once the
        # link is registered, and before anything a service sends on it, so a connection the peer makes
        # next is registered after this one (handshakes finish on threads of their own, in any order)
        link.owe(security.ACCEPTED)
        if is_tcp:
            link.start_read_ahead()
        self._on_accept(link, hello)
        link.settle(security.handshake_deadline())

    def _track(self, link: SocketLink) -> SocketLink:
        link.add_close_callback(self._forget)
        with self._lock:
            closed = self._stop.is_set()
            if not closed:
                self._links.add(link)
        if closed:  # a handshake that finished while close() ran: its link would outlive the transport
            link.close()
            raise ConnectionError("the transport was closed")
        return link

    def _forget(self, link: SocketLink) -> None:
        with self._lock:
            self._links.discard(link)

    def _use_local(self, endpoint: dict) -> bool:
        return os.environ.get(LOCAL_ENV, "1") != "0" and endpoint.get("host") == _host_id()

    def connect(self, endpoint: dict, hello: bytes, deadline: Optional[float]) -> Link:
        """Connect and authenticate; a peer whose process is gone fails at once (``_gone``), not
        after a wait on whatever may hold its port now."""
        _gone(endpoint)
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
                _gone(endpoint)  # or it has just ended: its socket went with it
        if sock is None:
            host, port = endpoint["tcp"]
            sock = socket.create_connection((host, port), timeout=_remaining(deadline))
            local = False
        try:
            _tune(sock, not local)
            # bounded by the handshake timeout even when the operation has no deadline
            limit = security.handshake_deadline(deadline)
            security.client_handshake(sock, limit, listener=endpoint.get("listener", ""))
            security.send_hello(sock, hello, limit)
            security.await_accepted(sock, limit)  # taken, and so in order with our next connection
        except security.NotTaken:
            sock.close()
            _gone(endpoint)  # not a busy listener but a dead peer: no point connecting again
            raise
        except BaseException:
            sock.close()
            raise
        return self._track(SocketLink(sock, local=local))

    def probe(self, endpoint: dict) -> bool:
        """Whether the peer still runs: by its pid and start time where they tell, else by its listener.

        A dead peer's port or pid, taken over since, does not make it look alive.
        """
        alive = _process_alive(endpoint)
        return _listener_proves_itself(endpoint) if alive is None else alive

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        with self._lock:
            if self._wakeup is not None:
                os.write(self._wakeup[1], b"x")  # the accept loop closes the pipe once it has seen this
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
