"""The worker side of ``python -m rlinf.scheduler status``: a small read-only listener.

A worker's calls run on its own thread or event loop, where a status request
would queue behind a long call; so every worker process also listens on a
port of its own, on a thread that does nothing else, and answers each
connection with one JSON snapshot: its identity, the calls it is running and
for how long (``calls``), and any sections its worker registered (the
channel host adds its queues).

Who may ask: the connection must prove it holds this worker's status token
(the HMAC challenge of ``security``, with the token as key) before a byte of
the snapshot is sent.  The token is published with the worker's record in the
launcher's registry, which only the cluster's processes can read (the Ray
cluster's authenticated clients; for MPI a file only the user can read).
Nothing is ever read from the connection but the handshake, and nothing is
unpickled: the listener cannot be made to run code or change state.

Nor can a client without the token hold the listener: connections go through
the same ``security.HandshakeGate`` as the cpu transport's, so at most
``security.MAX_PENDING_HANDSHAKES`` wait to prove themselves at once, each for
``SERVE_TIMEOUT`` at most, and one more drops the oldest of them.  A query
answers in one round trip, so it gets through any number of silent
connections held open; one dropped all the same is made again (``query``).
Nor can using up the process's descriptors end it: a failed ``accept()`` is
tried again after a wait, 10 ms doubling to 1 s (``security.AcceptBackoff``).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import struct
import threading
import time
from typing import Callable, Optional

from ..base import calls, context, security

_log = logging.getLogger("rlinf.status")
_LEN = struct.Struct("<I")
#: largest snapshot a client accepts (a channel with very many keys is cut short before this)
MAX_SNAPSHOT = 4 << 20
#: seconds one status connection may take on the worker's side (handshake and reply)
SERVE_TIMEOUT = 2.0
#: keys listed per channel at most; the rest are counted
MAX_KEYS = 200

_sections: dict[str, Callable[[], dict]] = {}
_server: Optional["_StatusServer"] = None
_lock = threading.Lock()


def add_section(name: str, fn: Callable[[], dict]) -> None:
    """Have ``fn()`` (JSON-able, quick, read-only) reported under ``name`` in this process's snapshot."""
    _sections[name] = fn


def snapshot() -> dict:
    """What this worker process is doing now (JSON-able)."""
    ctx = context.current()
    out: dict = {"pid": os.getpid(), "time": time.time(), "calls": calls.current()}
    if ctx is not None:
        info = ctx.info
        out.update(group=ctx.group_key, rank=ctx.rank, node=info.node_id, node_ip=info.node_ip,
                   hostname=info.hostname, gpus=list(info.available_gpus or []))
    for name, fn in list(_sections.items()):
        try:
            out[name] = fn()
        except Exception as exc:  # a section must never cost the rest of the answer
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
    return out


class _StatusServer:
    def __init__(self, host: str):
        self.token = secrets.token_bytes(32)
        self._gate = security.HandshakeGate(self._answer, name="rlinf-status", key=self.token,
                                            timeout=SERVE_TIMEOUT, hello=False)
        self._sock = socket.create_server((host, 0), backlog=128)
        self.host, self.port = host, self._sock.getsockname()[1]
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlinf-status", daemon=True)
        self._thread.start()

    def endpoint(self) -> dict:
        return {"host": self.host, "port": self.port, "token": self.token.hex(), "listener": self._gate.listener_id}

    def _loop(self) -> None:
        backoff = security.AcceptBackoff("rlinf-status")
        while not self._closed.is_set():
            try:
                # no deadline: close() shuts the socket down, which ends this wait
                conn, _ = self._sock.accept()
            except OSError as exc:
                if self._closed.is_set():  # close() shut the socket down
                    return
                # out of descriptors (a moment's flood elsewhere in this process) must not end the
                # listener for good, nor spin: wait, longer each time, then accept again
                self._closed.wait(backoff.failed(exc))
                continue
            backoff.accepted()
            self._gate.admit(conn)  # never blocks: the handshake runs on a thread of its own, bounded

    def _answer(self, conn: socket.socket, _hello: bytes) -> None:
        """The connection proved it holds the token (on its handshake thread): one snapshot, then close."""
        try:
            body = json.dumps(snapshot(), default=str).encode()
            conn.settimeout(SERVE_TIMEOUT)  # a client that does not read holds this thread that long at most
            conn.sendall(_LEN.pack(len(body)) + body)
        except OSError as exc:
            _log.debug("status answer to %s not sent: %s", security.describe_peer(conn), exc)
        finally:
            conn.close()

    def close(self) -> None:
        self._closed.set()
        self._gate.close()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept above (Linux)
        except OSError:
            pass
        self._sock.close()
        self._thread.join(SERVE_TIMEOUT + 1)  # bounded: the accept loop never waits on a connection


def start(host: str) -> Optional[dict]:
    """Listen on ``host`` (idempotent); the endpoint to publish with this worker's record.

    None if no port can be had there: the worker runs all the same, and status
    shows it as ``unknown``."""
    global _server
    with _lock:
        if _server is None:
            try:
                _server = _StatusServer(host)
            except OSError as exc:
                _log.warning("no status listener on %s: %s", host, exc)
                return None
        return _server.endpoint()


def stop() -> None:
    """The worker is released: stop listening and forget its sections."""
    global _server
    with _lock:
        server, _server = _server, None
    _sections.clear()
    if server is not None:
        server.close()


def query(endpoint: dict, timeout: float) -> dict:
    """Ask one worker for its snapshot; raises ``OSError`` (refused, reset, timed out) or ``ValueError``.

    A connection the listener dropped before its verdict (``security.NotTaken``: a flood of
    connections arrived meanwhile, each one newer) is made again until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return _query_once(endpoint, deadline)
        except security.NotTaken:
            if time.monotonic() + _RETRY_AFTER >= deadline:
                raise
            time.sleep(_RETRY_AFTER)


#: seconds between two tries of a query that the listener dropped unanswered
_RETRY_AFTER = 0.05


def _query_once(endpoint: dict, deadline: float) -> dict:
    left = max(0.01, deadline - time.monotonic())
    with socket.create_connection((endpoint["host"], int(endpoint["port"])), timeout=left) as sock:
        security.client_handshake(sock, deadline, key=bytes.fromhex(endpoint["token"]),
                                  listener=endpoint.get("listener", ""))
        (n,) = _LEN.unpack(security._recv_exact(sock, _LEN.size, deadline))
        if n > MAX_SNAPSHOT:
            raise ValueError(f"a status answer of {n} bytes is over the {MAX_SNAPSHOT}-byte limit")
        return json.loads(security._recv_exact(sock, n, deadline))
