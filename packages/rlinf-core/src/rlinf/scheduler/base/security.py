"""Who may connect: the cluster secret and the handshake every listener runs first.

Workers accept connections from their peers (point-to-point links, channel
clients).  Without a check, any process that can reach a port (or read the
names of abstract Unix sockets in ``/proc/net/unix``) could claim to be a
peer and send a pickle that the worker's next ``recv`` would run.  So every
listener admits only processes of its own cluster:

* The driver makes a random **cluster secret** when it connects to its
  cluster (or takes ``RLINF_CLUSTER_SECRET`` from its environment, for a
  cluster whose processes were started elsewhere).  It travels to the workers
  inside the worker spec, over the launcher's own authenticated channel (the
  Ray actor call, the MPI communicator): never in a file or on a command line.
* Before a single byte of a hello or payload is read, both sides prove that
  they hold the secret: a mutual challenge-response with HMAC-SHA256 over
  fresh random nonces, compared in constant time (the scheme of
  ``multiprocessing.connection``'s authkey, in both directions).  Both proofs
  also cover the id the listener published in its endpoint, so an answer
  cannot be relayed to another listener by a process that took over a dead
  peer's port and was dialled in its place.  The handshake has a deadline
  and the hello after it a size limit.
* On a Unix socket the listener first checks the peer's uid (``SO_PEERCRED``):
  another user's process is refused before the challenge.
* ``HandshakeGate`` runs the server side for a listener with a bounded number
  of unproven handshakes in flight, so a flood of idle connections from
  processes without the secret costs neither threads nor descriptors without
  limit.

* ``private_dir`` makes (or checks) a directory only this user can use, for
  what rlinf keeps in a shared place such as ``/tmp``: one that another user
  made first, that others may enter, or a symbolic link is refused.

A transport (built in or third party) calls ``HandshakeGate.admit`` for each
accepted connection and ``client_handshake`` + ``send_hello`` on each
connection it makes; see ``docs/security.md`` and ``docs/plugins.md``.
Refusals are logged at DEBUG level on the ``rlinf.security`` logger.  The
secret itself never appears in a log, a repr or an error message.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import hmac
import logging
import os
import secrets
import socket
import stat
import struct
import threading
import time
from typing import Callable, Optional

#: the cluster secret (made by the driver when absent; give one for a cluster started elsewhere)
SECRET_ENV = "RLINF_CLUSTER_SECRET"
#: seconds a connection has to complete the handshake and send its hello (default 5)
HANDSHAKE_TIMEOUT_ENV = "RLINF_HANDSHAKE_TIMEOUT"
DEFAULT_HANDSHAKE_TIMEOUT = 5.0
#: the largest hello a listener reads
MAX_HELLO = 64 << 10
#: connections one listener lets wait to prove themselves; past it the oldest is dropped
MAX_PENDING_HANDSHAKES = 64
MIN_SECRET_CHARS = 16

_MAGIC = b"RLINFA3\n"  # names the protocol and its version, so a stray client fails clearly (3: VERDICT)
_NONCE = 32
_DIGEST = hashlib.sha256().digest_size
_HELLO_LEN = struct.Struct("<I")
_UCRED = struct.Struct("3i")  # pid, uid, gid
# The listener's verdict on the client's answer, before its own proof: a refusal is said, so that a
# connection dropped unanswered (shed under load, or too slow) is one the client may make again.
_PROVEN = b"\x06"
_REFUSED = b"\x15"

log = logging.getLogger("rlinf.security")


class HandshakeError(ConnectionError):
    """The other side did not prove it belongs to this cluster, or broke the handshake."""


class NotTaken(HandshakeError):
    """The listener did not take the connection in time: it was too slow to begin the handshake,
    to answer it, or to take the connection once the hello arrived (a burst of hundreds of
    handshakes on a loaded machine), or it dropped the connection before its verdict on our
    answer (shed under load).  Nothing was sent on it but the handshake, so connecting again
    is safe, unlike after a refusal (the listener's verdict, or a proof of another secret).

    ``hello_sent``: whether the hello went out first.  If it did, the listener
    may still take the connection late (and find it empty); if not, it never
    will."""

    def __init__(self, message: str, hello_sent: bool = False):
        super().__init__(message)
        self.hello_sent = hello_sent


class _TimedOut(HandshakeError):
    """A handshake step missed its deadline (the other side is slow, not refusing)."""


# -- the secret ---------------------------------------------------------------------
def cluster_secret() -> bytes:
    """This process's cluster secret, made (and put in the environment) if there is none yet.

    Kept in ``os.environ`` so that the driver's launch forwards it to the
    workers with the other ``RLINF_*`` settings, and processes this one starts
    inherit it.  A secret given by the user must be at least 16 characters.
    """
    raw = os.environ.get(SECRET_ENV)
    if not raw:
        raw = os.environ[SECRET_ENV] = secrets.token_urlsafe(32)
    elif len(raw) < MIN_SECRET_CHARS:
        raise ValueError(
            f"{SECRET_ENV} is too short ({len(raw)} characters, at least {MIN_SECRET_CHARS} needed); "
            f"make one with: python -c 'import secrets; print(secrets.token_urlsafe(32))'"
        )
    return raw.encode()


def handshake_timeout() -> float:
    raw = os.environ.get(HANDSHAKE_TIMEOUT_ENV)
    if not raw:
        return DEFAULT_HANDSHAKE_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{HANDSHAKE_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{HANDSHAKE_TIMEOUT_ENV}={raw!r} must be positive")
    return value


def handshake_deadline(deadline: Optional[float] = None) -> float:
    """The earlier of ``deadline`` and the handshake timeout from now: a handshake never waits longer."""
    own = time.monotonic() + handshake_timeout()
    return own if deadline is None else min(deadline, own)


# -- bounded socket I/O ----------------------------------------------------------------
#: past the deadline, a read takes one last look this long: bytes that arrived while this process
#: was descheduled between two steps (hundreds of handshakes at once on 2 cores) still count.
#: A send is never late: what it sends past the deadline, the other side may no longer take.
_LAST_LOOK = 0.001


def _settimeout(sock: socket.socket, deadline: float, looked: bool = True) -> bool:
    """Set the socket's timeout to what is left.  Past the deadline: ``_TimedOut`` if the last look
    was ``looked`` at already (always, for a send), else a timeout of ``_LAST_LOOK`` and True."""
    left = deadline - time.monotonic()
    if left <= 0 and looked:
        raise _TimedOut("the handshake did not complete before its deadline")
    sock.settimeout(left if left > 0 else _LAST_LOOK)
    return left <= 0


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    pos = 0
    looked = False
    while pos < n:  # bounded: past the deadline, one more read at most
        looked = _settimeout(sock, deadline, looked)
        try:
            got = sock.recv_into(view[pos:])
        except socket.timeout:
            raise _TimedOut("the handshake did not complete before its deadline") from None
        if got == 0:
            raise HandshakeError("the other side closed the connection during the handshake")
        pos += got
    return bytes(buf)


def _send_all(sock: socket.socket, data: bytes, deadline: float) -> None:
    _settimeout(sock, deadline)
    try:
        sock.sendall(data)
    except socket.timeout:
        raise _TimedOut("the handshake did not complete before its deadline") from None


def _mac(key: bytes, role: bytes, first: bytes, second: bytes, listener: str) -> bytes:
    # the role label keeps a proof made as a client from being replayed as a server's, and vice
    # versa; the listener's id keeps an answer made for one listener from being relayed to another
    return hmac.new(key, role + first + second + b"|" + listener.encode(), hashlib.sha256).digest()


def new_listener_id() -> str:
    """A random name for one listener, published in its endpoint and bound into its handshakes."""
    return secrets.token_hex(16)


# -- the handshake ----------------------------------------------------------------------
def peer_credentials(sock: socket.socket) -> Optional[tuple[int, int, int]]:
    """``(pid, uid, gid)`` of the process at the other end of a Unix socket, else None."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if sock.family != socket.AF_UNIX or opt is None:
        return None
    return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, opt, _UCRED.size))


def check_peer_uid(sock: socket.socket) -> None:
    """On a Unix socket, refuse a peer running as another user (before any byte is exchanged)."""
    creds = peer_credentials(sock)
    if creds is not None and creds[1] != os.getuid():
        raise HandshakeError(f"the process at the other end (pid {creds[0]}) runs as uid {creds[1]}, not {os.getuid()}")


def server_handshake(sock: socket.socket, deadline: float, key: Optional[bytes] = None,
                     proven: Optional[Callable[[], bool]] = None, listener: str = "") -> None:
    """The listening side: prove the peer holds the cluster secret (``key``, default this process's), then prove we do.

    Raises ``HandshakeError`` (the caller closes the socket) if the peer is
    another user (Unix sockets), answers wrongly (told so before the close),
    closes, or is too slow.  ``proven``: called once the peer's answer checks
    out; False means the listener has dropped the connection meanwhile.
    ``listener``: this listener's id (``new_listener_id``), which the client
    must name: an answer relayed from a client that dialled another listener
    (a process that took over a dead peer's port) does not check out.
    """
    check_peer_uid(sock)
    key = key or cluster_secret()
    challenge = secrets.token_bytes(_NONCE)
    _send_all(sock, _MAGIC + challenge, deadline)
    reply = _recv_exact(sock, _NONCE + _DIGEST, deadline)
    theirs, proof = reply[:_NONCE], reply[_NONCE:]
    if not hmac.compare_digest(proof, _mac(key, b"client", challenge, theirs, listener)):
        try:  # said, so the client does not take it for a listener too busy to answer
            _send_all(sock, _REFUSED, min(deadline, time.monotonic() + 1.0))
        except (HandshakeError, OSError):
            pass
        raise HandshakeError("the peer does not hold this cluster's secret")
    if proven is not None and not proven():
        raise HandshakeError("dropped while its answer was checked")
    _send_all(sock, _PROVEN + _mac(key, b"server", theirs, challenge, listener), deadline)


def client_handshake(sock: socket.socket, deadline: float, key: Optional[bytes] = None, listener: str = "") -> None:
    """The connecting side: answer the listener's challenge and check its proof in turn.

    ``key`` defaults to the cluster secret (the status listener uses a token of its own).
    ``listener``: the id the endpoint we dial published (``HandshakeGate.listener_id``).
    Raises ``HandshakeError`` if the listener is not an rlinf listener of this
    cluster (another secret, another user, another program).
    """
    check_peer_uid(sock)
    key = key or cluster_secret()
    try:
        head = _recv_exact(sock, len(_MAGIC) + _NONCE, deadline)
    except (HandshakeError, OSError) as exc:  # it has not begun: too busy to begin, or it shed us first
        raise NotTaken(f"the listener did not begin the handshake ({exc})") from None
    if head[: len(_MAGIC)] != _MAGIC:
        raise HandshakeError("the listener did not start an rlinf handshake (another program, or another rlinf version)")
    challenge = head[len(_MAGIC):]
    ours = secrets.token_bytes(_NONCE)
    try:
        _send_all(sock, ours + _mac(key, b"client", challenge, ours, listener), deadline)
        verdict = _recv_exact(sock, 1, deadline)
    except (HandshakeError, OSError) as exc:  # unanswered: too slow to check our answer, or shed while it did
        raise NotTaken(f"the listener did not answer ({exc})") from None
    if verdict != _PROVEN:
        raise HandshakeError(
            "the listener refused this process: both sides must hold the same cluster secret "
            f"({SECRET_ENV}, which a driver forwards to the workers it launches), and the listener must "
            "be the one the endpoint named (not a process that took over its port since)"
            if verdict == _REFUSED else "the listener answered the handshake with something other than its verdict"
        )
    try:
        proof = _recv_exact(sock, _DIGEST, deadline)  # sent with the verdict
    except (HandshakeError, OSError) as exc:  # no hello went out: the listener drops it unused
        raise NotTaken(f"the listener's proof did not arrive ({exc})") from None
    if not hmac.compare_digest(proof, _mac(key, b"server", ours, challenge, listener)):
        raise HandshakeError("the listener does not hold this cluster's secret")


def send_hello(sock: socket.socket, hello: bytes, deadline: float) -> None:
    """Send the connection's hello (length-prefixed, at most ``MAX_HELLO`` bytes), after ``client_handshake``."""
    if len(hello) > MAX_HELLO:
        raise ValueError(f"a hello of {len(hello)} bytes is over the {MAX_HELLO}-byte limit")
    try:
        _send_all(sock, _HELLO_LEN.pack(len(hello)) + bytes(hello), deadline)
    except _TimedOut as exc:  # this side was too slow (descheduled): the listener never takes a partial hello
        raise NotTaken(f"the hello did not go out in time ({exc})") from None
    except OSError as exc:  # the listener dropped it first (its own deadline passed): it never takes it
        raise NotTaken(f"the listener dropped the connection before the hello ({exc})") from None


def recv_hello(sock: socket.socket, deadline: float) -> bytes:
    """Read the hello that ``send_hello`` sent, refusing one over ``MAX_HELLO`` bytes before reading it."""
    (n,) = _HELLO_LEN.unpack(_recv_exact(sock, _HELLO_LEN.size, deadline))
    if n > MAX_HELLO:
        raise HandshakeError(f"a hello of {n} bytes is over the {MAX_HELLO}-byte limit")
    return _recv_exact(sock, n, deadline)


#: the byte a listener sends once it has taken a connection (registered it where its reader finds it)
ACCEPTED = b"\x06"


def await_accepted(sock: socket.socket, deadline: float) -> None:
    """After ``send_hello``: wait until the listener has taken the connection.

    Until then the listener may still drop it (its handshake deadline, its
    bound on handshakes in flight), and bytes sent meanwhile would be lost
    without an error.  It also orders connections: one made after this
    returns is taken after this one, even though the listener finishes
    handshakes on threads of their own.
    """
    try:
        got = _recv_exact(sock, 1, deadline)
    except (HandshakeError, OSError) as exc:
        raise NotTaken(f"the listener did not take the connection ({exc})", hello_sent=True) from None
    if got != ACCEPTED:
        raise HandshakeError("the listener answered the hello with something other than its acknowledgement")


def describe_peer(sock: socket.socket) -> str:
    """Who is at the other end, for a log line (address, or pid and uid on a Unix socket)."""
    try:
        creds = peer_credentials(sock)
        if creds is not None:
            return f"unix peer pid {creds[0]} uid {creds[1]}"
        host, port = sock.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "an unknown peer"


class HandshakeGate:
    """The server side of the handshake for one listener, with a bound on unproven handshakes in flight.

    ``admit(conn)`` for each accepted connection: a thread authenticates it
    (``server_handshake``) and reads its hello (``recv_hello``) under one
    deadline, then calls ``on_ready(conn, hello)`` on that thread, which owns
    the connection from then on.  A listener that takes no hello (the status
    listener: it only answers) passes ``hello=False`` and gets ``b""``; one
    keyed with something other than the cluster secret passes ``key``, and
    ``timeout`` replaces the handshake timeout (``RLINF_HANDSHAKE_TIMEOUT``).  A refused,
    malformed or slow connection is closed and logged at DEBUG level; it never
    reaches ``on_ready``.  At most ``limit`` connections wait to prove
    themselves at once: when one more arrives, the oldest of them (an idle
    connection, most likely: a real peer answers in one round trip) is
    dropped, so a burst of idle connections delays real peers by nothing.
    A connection whose answer checked out is never dropped for load: it holds
    the cluster's secret (hundreds of real peers connecting at once), and
    a real peer dropped unanswered connects again.
    """

    def __init__(self, on_ready: Callable[[socket.socket, bytes], None], name: str = "rlinf",
                 limit: int = MAX_PENDING_HANDSHAKES, key: Optional[bytes] = None,
                 timeout: Optional[float] = None, hello: bool = True):
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit!r}")
        self._on_ready = on_ready
        self._name = name
        self._limit = limit
        self._timeout = handshake_timeout() if timeout is None else timeout
        self._key = key or cluster_secret()  # fixed for the listener's life
        self._hello = hello
        #: publish it in the listener's endpoint: a connecting side names it in ``client_handshake``
        self.listener_id = new_listener_id()
        self._unproven: "collections.OrderedDict[socket.socket, None]" = collections.OrderedDict()
        self._proven: set = set()  # answered correctly; hello not read yet
        self._lock = threading.Lock()
        self._closed = False

    def admit(self, conn: socket.socket) -> None:
        """Take an accepted connection; never blocks and never raises."""
        try:
            check_peer_uid(conn)  # another user's process: refused here, before the challenge and any thread
        except (HandshakeError, OSError) as exc:
            conn.close()
            log.debug("%s: refused a connection: %s", self._name, exc)
            return
        with self._lock:
            if self._closed:
                conn.close()
                return
            if len(self._unproven) >= self._limit:
                oldest, _ = self._unproven.popitem(last=False)
                log.debug("%s: %d handshakes unproven; dropping the oldest (%s)", self._name, self._limit,
                          describe_peer(oldest))
                _abort(oldest)
            self._unproven[conn] = None
        try:
            threading.Thread(target=self._run, args=(conn,), name=f"{self._name}-handshake", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had: refuse this one, keep accepting
            with self._lock:
                self._unproven.pop(conn, None)
            conn.close()
            log.debug("%s: refused a connection: %s", self._name, exc)

    def _prove(self, conn: socket.socket) -> bool:
        """The answer checked out: out of reach of load shedding (False if it was dropped already)."""
        with self._lock:
            if conn not in self._unproven:  # dropped by admit() or close()
                return False
            del self._unproven[conn]
            self._proven.add(conn)
            return True

    def _run(self, conn: socket.socket) -> None:
        deadline = time.monotonic() + self._timeout
        who = describe_peer(conn)
        try:
            server_handshake(conn, deadline, self._key, proven=lambda: self._prove(conn), listener=self.listener_id)
            hello = recv_hello(conn, deadline) if self._hello else b""
        except Exception as exc:  # refused, malformed, slow or dropped: the connection ends here
            with self._lock:
                self._unproven.pop(conn, None)
                self._proven.discard(conn)
            conn.close()
            log.debug("%s: refused a connection from %s: %s", self._name, who, _reason(exc))
            return
        with self._lock:
            if conn not in self._proven:  # ended by close() meanwhile
                conn.close()
                return
            self._proven.discard(conn)
        try:
            self._on_ready(conn, hello)
        except Exception:
            log.debug("%s: could not take the connection from %s", self._name, who, exc_info=True)
            conn.close()

    def close(self) -> None:
        """Stop admitting; end the handshakes in flight."""
        with self._lock:
            self._closed = True
            pending = list(self._unproven) + list(self._proven)
            self._unproven, self._proven = collections.OrderedDict(), set()
        for conn in pending:
            _abort(conn)


def _abort(conn: socket.socket) -> None:
    """End a connection that a handshake thread is blocked on: shutdown wakes it, its thread closes it."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, HandshakeError) else f"{type(exc).__name__}: {exc}"


#: ``accept()`` errors that end one connection only (the peer reset it first): accept the next at once
_ACCEPT_PASSING = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EAGAIN, errno.EINTR, errno.EPERM})


class AcceptBackoff:
    """What an accept loop does when ``accept()`` fails, so that it neither ends nor spins a core.

    ``failed(exc)`` gives the seconds to wait before the next ``accept()``: none for an
    error of the one connection, else (out of descriptors or memory, or anything unknown)
    10 ms, doubling to at most ``most``; ``accepted()`` after a success starts over."""

    def __init__(self, name: str, first: float = 0.01, most: float = 1.0):
        self._name, self._first, self._most = name, first, most
        self._next = first

    def failed(self, exc: OSError) -> float:
        if exc.errno in _ACCEPT_PASSING:
            return 0.0
        wait, self._next = self._next, min(self._most, self._next * 2)
        (log.warning if wait == self._first else log.debug)(
            "%s: accept failed (%s); trying again in %.2f s", self._name, exc, wait)
        return wait

    def accepted(self) -> None:
        self._next = self._first


# -- private directories ----------------------------------------------------------------
class PrivateDirError(PermissionError):
    """A directory that must be this user's alone is not; the message says why and what to do."""


def _user(uid: int) -> str:
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _resolve(path: str, hint: str) -> str:
    """``path`` (absolute) with every symbolic link on it resolved, as ``os.path.realpath`` does; the part
    that does not exist yet is kept as written.  ``PrivateDirError`` for a link made by another user than
    this one or root: its owner chose where the path leads, and may re-point it at any time."""
    me, hops = os.geteuid(), 0
    todo, done = collections.deque(path.split("/")), "/"
    while todo:
        name = todo.popleft()
        if name in ("", "."):
            continue
        if name == "..":
            done = os.path.dirname(done)
            continue
        step = os.path.join(done, name)
        try:
            st = os.lstat(step)
        except (FileNotFoundError, NotADirectoryError):
            return os.path.join(step, *todo)
        if not stat.S_ISLNK(st.st_mode):
            done = step
            continue
        target = os.readlink(step)
        if st.st_uid not in (0, me):
            raise PrivateDirError(
                f"{step} is a symbolic link (to {target}) made by {_user(st.st_uid)}, on the way to {path}: "
                f"its owner decides where your files go and may re-point it at any time; name the place "
                f"without it (remove the link as its owner or root: rm {step})" + (f", {hint}" if hint else ""))
        hops += 1
        if hops > 40:
            raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
        todo.extendleft(reversed(target.split("/")))
        if target.startswith("/"):
            done = "/"
    return done


def _check_parents(path: str, hint: str) -> None:
    """``PrivateDirError`` unless only this user (or root) can replace ``path`` (no links on it, see
    ``_resolve``) or anything on the way there: each directory above it, from ``/`` down to the last one
    that exists, must be this user's or root's, writable by nobody else unless it has the sticky bit."""
    names = path.split("/")[1:]
    for depth in range(len(names)):
        here = "/" + "/".join(names[:depth])
        try:
            st = os.lstat(here)
        except FileNotFoundError:
            return  # made by this user next, 0700
        shared = st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX
        if stat.S_ISDIR(st.st_mode) and st.st_uid in (0, os.geteuid()) and not shared:
            continue
        raise PrivateDirError(
            f"{here} ({_user(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}) lets other users replace "
            f"{names[depth]} in it; choose a place that only you (or root) can write, or one with the sticky "
            f"bit (chmod +t)" + (f", {hint}" if hint else ""))


def private_dir(path: str, create: bool = True, hint: str = "") -> str:
    """``path``, a directory only this user can use: made with mode 0700 when missing (``create``), else checked.

    What rlinf keeps in a shared place (status tokens, a cluster's sockets) must
    be nobody else's to read, replace or take away, and names there are easy
    to guess.  So a directory that another user made first, that group or
    others may use, or a symbolic link (wherever it points) is refused with
    ``PrivateDirError``: it names the path, what is wrong and the fix, and
    ``hint`` adds the caller's own way out (an environment variable that picks
    another place, say).  Nothing in a refused directory is touched.  Missing
    parents are made as ``mkdir -p`` does, the last one 0700.  The parents are checked too, each
    from ``/`` down, before anything is made there: another user who may write to one, without
    the sticky bit (as /tmp has), could rename ``path`` (or a directory on the way) away and put
    their own in its place, so each must be this user's or root's and writable by nobody else
    unless sticky.  Symbolic links among the parents are resolved first and the returned path
    has none: one who kept using a link would follow it again on each use, wherever it then
    points.  A link there that another user (not root) made is refused: its owner, not this
    user, chose the place.  ``FileNotFoundError`` when the directory is missing and ``create``
    is False.  Returns the path to use from then on, ``path`` with the links among its parents
    resolved: callers must use it, not ``path``.
    """
    parent = _resolve(os.path.dirname(os.path.abspath(path)), hint)
    path = os.path.join(parent, os.path.basename(os.path.abspath(path)))
    _check_parents(path, hint)  # before anything is made there
    if create:
        os.makedirs(parent, mode=0o700, exist_ok=True)  # a parent made here is the user's alone too
        _check_parents(path, hint)
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass  # checked below, like one found there
    st = os.lstat(path)  # not stat: a link is refused, not followed
    me = os.geteuid()
    ask = f"remove it (as its owner, or root: rm -r {path})"
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        problem, fix = f"is a symbolic link (to {target}), made by {_user(st.st_uid)}", ask
    elif not stat.S_ISDIR(st.st_mode):
        problem, fix = f"is not a directory (made by {_user(st.st_uid)})", ask
    elif st.st_uid != me:
        problem, fix = f"is owned by {_user(st.st_uid)}, not by you ({_user(me)})", ask
    elif st.st_mode & 0o077:
        problem = f"has mode {oct(stat.S_IMODE(st.st_mode))}: group or others may use it"
        fix = f"check what others put there, then chmod 700 {path}"
    else:
        return path
    raise PrivateDirError(f"{path} {problem}; it must be a directory that only you can use (yours, mode 0700). "
                          f"To fix: {fix}" + (f", {hint}" if hint else ""))
