"""The far end for device-transport conformance tests: echoes tensors on their device.

Run as ``python -m rlinf.testing._device_echo_peer NAME DEVICE``: prints its
endpoint as one JSON line, then for every message on every incoming link
(a JSON list of ``[shape, dtype]`` on the host path) receives the tensors
into fresh tensors on DEVICE (``recv_tensors_into``) and sends header and
tensors back the same way.  A header ``"die"`` ends the process abruptly.
"""

from __future__ import annotations

import json
import os
import sys
import threading


def _serve(device: str):
    import torch

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))

    def on_accept(link, hello):
        def loop():
            while True:
                try:
                    _, frames = link.recv(None)
                    head = json.loads(bytes(frames[0]))
                    if head == "die":
                        os._exit(17)
                    tensors = [torch.empty(shape, dtype=getattr(torch, dtype), device=device) for shape, dtype in head]
                    link.recv_tensors_into(tensors, None)
                    link.send([frames[0]], None)
                    link.send_tensors(tensors, None)
                except Exception:
                    return

        threading.Thread(target=loop, daemon=True).start()

    return on_accept


def main() -> None:
    from rlinf.scheduler.plugins import get_registry

    name, device = sys.argv[1], sys.argv[2]
    transport = get_registry().transport(name, device.split(":")[0]).descriptor.factory()
    endpoint = transport.listen(_serve(device), "127.0.0.1")
    print(json.dumps(endpoint), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    os._exit(0)


if __name__ == "__main__":
    main()
