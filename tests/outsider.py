"""A process that is not part of the cluster, attacking a worker's listener (used by test_security.py).

Run as ``python tests/outsider.py '<json spec>'``; prints one JSON line with
what happened.  The raw attacks use nothing but the standard library: this is
what any local process could do.  Modes:

* ``attack``: write a hello claiming to be a peer, then a data message whose
  pickle runs ``touch <marker>`` when unpickled (the cpu transport's wire format).
* ``garbage``: write random bytes.  ``silent``: write nothing.
* ``handshake``: run rlinf's client handshake with whatever secret this
  process was given, then send ``hello`` (or only a length prefix of
  ``hello_size`` bytes), and report whether the listener kept the connection.
* ``as_uid``: drop to ``uid`` first (needs root), then ``attack``.
"""

import json
import os
import pickle
import socket
import struct
import sys
import time


def open_socket(spec) -> socket.socket:
    if spec["family"] == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect("\0" + spec["unix"])
        return s
    return socket.create_connection(tuple(spec["tcp"]), timeout=10)


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def forged(spec) -> bytes:
    hello = json.dumps(spec["hello"]).encode()
    stream = pickle.dumps(Evil(spec["marker"]))
    message = struct.pack("<BBHHH", 1, 0, 1, 0, 0) + struct.pack("<BxxxIQQ", 0, 0, 0, len(stream)) + stream
    return struct.pack("<I", len(hello)) + hello + message


def drain(s: socket.socket, limit: float) -> dict:
    """Read until the listener closes the connection (or ``limit`` seconds pass)."""
    start = time.monotonic()
    got = b""
    s.settimeout(limit)
    closed = False
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                closed = True
                break
            got += chunk
    except socket.timeout:
        pass
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    return {"closed": closed, "received": len(got), "seconds": time.monotonic() - start}


def send_quietly(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass  # the listener already hung up: what we want


def main() -> None:
    spec = json.loads(sys.argv[1])
    mode = spec["mode"]
    if mode == "as_uid":
        os.setgid(spec["uid"])
        os.setuid(spec["uid"])
        mode = "attack"
    s = open_socket(spec)
    out = {}
    if mode == "attack":
        send_quietly(s, forged(spec))
    elif mode == "garbage":
        send_quietly(s, os.urandom(4096))
    elif mode == "handshake":
        from rlinf.scheduler.base import security

        try:
            security.client_handshake(s, time.monotonic() + 10, listener=spec["listener"])
            out["accepted"] = True
        except security.HandshakeError as exc:
            out["accepted"] = False
            out["error"] = str(exc)
        if out["accepted"] and "hello_size" in spec:
            send_quietly(s, struct.pack("<I", spec["hello_size"]) + b"x" * 1024)
        elif out["accepted"] and "hello" in spec:
            security.send_hello(s, json.dumps(spec["hello"]).encode(), time.monotonic() + 10)
    out.update(drain(s, spec.get("wait", 20.0)))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
