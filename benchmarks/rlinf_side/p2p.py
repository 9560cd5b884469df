"""RLinf 0.3.0's side of ``benchmarks/p2p.py``: send/recv and send_tensor/recv_tensor between two workers.

Arguments (JSON): ``sizes`` (MiB, a list), ``pingpongs``, ``rounds`` as in
``benchmarks/p2p.py``.

Prints: ``rtt`` (seconds per round trip of a small dict with ``send``/``recv``,
best of rounds) and ``bw`` (size in MiB -> {"send/recv", "send_tensor"} ->
bytes/s, one-way, streaming K tensors then waiting for an ack, best of
rounds; K = max(3, min(50, 512 // size)) as in the project's benchmark).
"""

from __future__ import annotations

import time

import _harness

from rlinf.scheduler import NodePlacementStrategy, Worker

MiB = 1 << 20
SMALL_MESSAGE = {"step": 0, "reward": 0.5, "done": False, "info": "ok"}


class BenchPeer(Worker):
    def __init__(self):
        super().__init__()
        self.name = self._group_name

    def _round_trip(self, msg):
        if self._rank == 0:
            self.send(msg, self.name, 1)
            self.recv(self.name, 1)
        else:
            self.send(self.recv(self.name, 0), self.name, 0)

    def pingpong(self, n):
        for _ in range(20):
            self._round_trip(SMALL_MESSAGE)
        start = time.perf_counter()
        for _ in range(n):
            self._round_trip(SMALL_MESSAGE)
        return (time.perf_counter() - start) / n

    def stream(self, nbytes, k, raw):
        import torch

        n = nbytes // 4
        if self._rank == 0:
            t = torch.ones(n)
            for _ in range(2):
                self._push(t, raw)
            self.recv(self.name, 1)
            start = time.perf_counter()
            for _ in range(k):
                self._push(t, raw)
            self.recv(self.name, 1)
            return nbytes * k / (time.perf_counter() - start)
        buf = torch.empty(n) if raw else None
        for _ in range(2):
            self._pull(buf, raw)
        self.send("ack", self.name, 0)
        for _ in range(k):
            self._pull(buf, raw)
        self.send("ack", self.name, 0)
        return None

    def _push(self, t, raw):
        if raw:
            self.send_tensor(t, self.name, 1)
        else:
            self.send(t, self.name, 1)

    def _pull(self, buf, raw):
        if raw:
            self.recv_tensor(buf, self.name, 0)
        else:
            self.recv(self.name, 0)


def main() -> None:
    a = _harness.args()
    sizes, pingpongs, rounds = a.get("sizes", [1, 64, 256]), a.get("pingpongs", 1000), a.get("rounds", 3)
    cluster = _harness.cluster()
    group = BenchPeer.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="bench_p2p")
    out = {"rtt": min(group.pingpong(pingpongs).wait()[0] for _ in range(rounds)), "bw": {}}
    for size in sizes:
        k, nbytes = max(3, min(50, 512 // size)), size * MiB
        out["bw"][str(size)] = {
            "send/recv": max(group.stream(nbytes, k, False).wait()[0] for _ in range(rounds)),
            "send_tensor": max(group.stream(nbytes, k, True).wait()[0] for _ in range(rounds)),
        }
    group._close()
    _harness.emit(out)
    _harness.shutdown()


if __name__ == "__main__":
    main()
