"""The CPU transport's listener: a TCP socket and an abstract Unix one, and the thread that accepts on both.

Every accepted connection goes straight to the transport's
``security.HandshakeGate`` (``admit``), which authenticates it, within a bound
on unproven handshakes in flight, before any link exists.  The abstract Unix
socket leaves no file to clean up.  When ``accept()`` fails (out of descriptors, say, for as
long as a flood lasts) the loop waits, 10 ms doubling to 1 s (``security.AcceptBackoff``),
instead of spinning on the connection still queued, and serves again once it can.
"""

from __future__ import annotations

import os
import selectors
import socket
import threading
import uuid

from ..base import security


class Listener:
    """Listens on ``local_ip`` (TCP) and an abstract Unix socket until ``close``, handing each connection to ``gate``."""

    def __init__(self, local_ip: str, gate: security.HandshakeGate):
        self._gate = gate
        self._stop = threading.Event()
        self._lock = threading.Lock()
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
        #: the endpoint's addresses: where peers connect
        self.address = {"tcp": [local_ip, tcp.getsockname()[1]], "unix": unix_name[1:]}

    def _accept_loop(self) -> None:
        """Accept until ``close``; the loop owns the selector and closes it on its way out.

        (Closing the selector from another thread while this one waits in it
        can leave this thread waiting on a reused descriptor, forever.)
        """
        backoff = security.AcceptBackoff("rlinf-cpu")
        try:
            while not self._stop.is_set():
                try:
                    events = self._selector.select(timeout=0.5)
                except (OSError, ValueError):
                    return
                wait = 0.0
                for key, _ in events:
                    if key.fileobj == self._wakeup[0]:
                        return
                    try:
                        conn, _ = key.fileobj.accept()
                    except OSError as exc:
                        if self._stop.is_set():  # close() closed the socket
                            return
                        # out of descriptors the connection stays queued and select() says so again at
                        # once: wait (10 ms, doubling to 1 s) instead of spinning, then accept again
                        wait = max(wait, backoff.failed(exc))
                        continue
                    backoff.accepted()
                    self._gate.admit(conn)  # bounded: never more than a few dozen unproven handshakes in flight
                if wait:
                    self._stop.wait(wait)  # close() sets it: the loop still ends at once
        finally:
            self._selector.close()
            with self._lock:  # close() writes to the pipe only while it is ours
                wakeup, self._wakeup = self._wakeup, None
            for fd in wakeup:
                os.close(fd)

    def close(self) -> None:
        """Stop accepting and close both sockets; the accept loop ends within its next wait."""
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
