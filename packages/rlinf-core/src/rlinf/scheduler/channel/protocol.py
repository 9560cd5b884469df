"""The channel wire protocol, on top of any transport link.

A request is ``[control, *item_frames]`` and a reply likewise, where
``control`` is a small JSON object (``id``, ``op``, ``key``, ...) and the item
frames are exactly what ``p2p.codec.encode`` produced: the host stores and
forwards them without decoding, so tensors are never pickled and the host
needs no torch.
"""

from __future__ import annotations

import json

def control(frame) -> dict:
    return json.loads(bytes(frame))


def pack(ctrl: dict) -> bytes:
    return json.dumps(ctrl, separators=(",", ":")).encode()
