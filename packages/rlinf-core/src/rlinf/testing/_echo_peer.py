"""The far end for transport conformance tests: a process that echoes messages.

Run as ``python -m rlinf.testing._echo_peer NAME``: prints its endpoint as one
JSON line, then echoes every message on every incoming link back on the same
link (keeping the raw flag).  A message whose first frame is ``b"die"`` ends
the process abruptly; ``b"hold"`` stops echoing on that link.
"""

from __future__ import annotations

import json
import os
import sys
import threading


def echo_serve(link, hello) -> None:
    """``on_accept`` of an echo peer: echo every message on ``link`` from a thread of its own."""

    def loop():
        while True:
            try:
                raw, frames = link.recv(None)
            except Exception:
                return
            first = bytes(frames[0]) if frames else b""
            if first == b"die":
                os._exit(17)
            if first == b"hold":
                return
            link.send([bytes(hello)] + list(frames) if first == b"hello?" else frames, None, raw=raw)

    threading.Thread(target=loop, daemon=True).start()


def main() -> None:
    from rlinf.scheduler.plugins import get_registry

    transport = get_registry().transport(sys.argv[1]).descriptor.factory()
    endpoint = transport.listen(echo_serve, "127.0.0.1")
    print(json.dumps(endpoint), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    os._exit(0)


if __name__ == "__main__":
    main()
