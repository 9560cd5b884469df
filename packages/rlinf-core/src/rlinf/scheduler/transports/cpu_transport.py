"""The built-in CPU transport: sockets everywhere, shared memory on one host.

Peers on one host connect over a Unix socket (abstract namespace: no file to
clean up) and large buffers travel through ``memfd`` shared memory: one copy
on the sender, none on the receiver.  Peers on different hosts (or when
``RLINF_CPU_LOCAL=0``) connect over TCP and buffers travel inline.

Every connection starts with ``rlinf.scheduler.base.security``'s handshake (the
cluster secret, both ways) and the length-prefixed hello; only then does a
``SocketLink`` exist.

``CpuTransport`` ties the parts together: the listener and its handshake gate
(``cpu_listener``), the links (``cpu_link``, whose wire format is in
``cpu_wire``) and peer liveness (``cpu_liveness``).
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Callable, Optional

from ..base import security
from ..plugins.transport import Link, Transport
from . import cpu_liveness
from .cpu_link import SocketLink
from .cpu_listener import Listener
from .cpu_liveness import _gone, _host_id, _process_identity
from .cpu_wire import _remaining

__all__ = ["CpuTransport", "SocketLink", "LOCAL_ENV"]

LOCAL_ENV = "RLINF_CPU_LOCAL"


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
        self._listener: Optional[Listener] = None
        self._stop = threading.Event()
        self._on_accept: Optional[Callable] = None
        self._gate: Optional[security.HandshakeGate] = None
        self._links: set[SocketLink] = set()  # open links only: a closed one is forgotten
        self._lock = threading.Lock()

    def listen(self, on_accept, local_ip: str) -> dict:
        security.cluster_secret()  # a bad RLINF_CLUSTER_SECRET fails here, before anything listens
        self._on_accept = on_accept
        self._gate = security.HandshakeGate(self._authenticated, name="rlinf-cpu")
        self._listener = Listener(local_ip, self._gate)
        return {
            **self._listener.address,  # tcp, unix
            "host": _host_id(),
            **_process_identity(),  # pid, pid namespace, start time: see probe
            "listener": self._gate.listener_id,  # bound into every handshake with this listener
        }

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
        return cpu_liveness.probe(endpoint)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
        if self._gate is not None:
            self._gate.close()
        with self._lock:
            links, self._links = list(self._links), set()
        for link in links:
            link.close()
