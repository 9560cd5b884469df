"""Runs in its own interpreter after rlinf-plaintcp is installed: selects it by name."""

import os
import sys

from rlinf.scheduler import Cluster, CollectiveGroupOptions, NodePlacementStrategy, Worker, WorkerMethodError


class Pair(Worker):
    def __init__(self):
        super().__init__()

    def talk(self, transport):
        opts = CollectiveGroupOptions(transport=transport)
        name = self.worker_group_name
        if self._rank == 0:
            self.send({"hello": [1, 2, 3]}, name, 1, options=opts)
            return self.recv(name, 1, options=opts)
        got = self.recv(name, 0, options=opts)
        self.send(("echo", got), name, 0, options=opts)
        from rlinf.scheduler.messaging.p2p.communicator import local_communicator

        return local_communicator()._in[f"{name}:0"].transport

    def mismatched(self):
        name = self.worker_group_name
        if self._rank == 0:
            self.send("x", name, 1, options=CollectiveGroupOptions(transport="plaintcp"))
            return "sent"
        return self.recv(name, 0, options=CollectiveGroupOptions(transport="cpu"), timeout=30)

    def default_transport(self):
        from rlinf.scheduler.messaging.p2p.communicator import local_communicator

        return local_communicator().transport_name(None)


def main():
    cluster = Cluster(temp_dir=sys.argv[1], log_to_driver=False)
    g = Pair.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="pair")
    assert g.talk("plaintcp").wait() == [("echo", {"hello": [1, 2, 3]}), "plaintcp"]
    try:
        g.mismatched().wait()
        raise AssertionError("a transport mismatch went unnoticed")
    except WorkerMethodError as exc:
        assert exc.rank == 1 and "both ends of a pair must agree" in str(exc), exc
    assert g.default_transport().wait() == ["cpu", "cpu"]  # the built-in has the higher priority
    g.stop()
    os.environ["RLINF_TRANSPORT"] = "plaintcp"
    h = Pair.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="pair_env")
    assert h.default_transport().wait() == ["plaintcp", "plaintcp"]
    cluster.shutdown()
    print("THIRD PARTY OK")


if __name__ == "__main__":
    main()
