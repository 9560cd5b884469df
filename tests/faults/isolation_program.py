"""One of two independent programs run at once: same group and channel names."""

import sys

from rlinf.scheduler import Channel, Cluster, NodePlacementStrategy, Worker


class Twin(Worker):
    def __init__(self, tag):
        super().__init__()
        self.tag = tag

    def ping(self):
        name = self.worker_group_name
        if self._rank == 0:
            self.send(self.tag, name, 1)
            return self.recv(name, 1)
        got = self.recv(name, 0)
        self.send(got, name, 0)
        return got


def main():
    tag, temp_dir = sys.argv[1], sys.argv[2]
    cluster = Cluster(temp_dir=temp_dir, log_to_driver=False)
    group = Twin.create_group(tag).launch(cluster, NodePlacementStrategy([0, 0]), name="same_name")
    assert group.ping().wait() == [tag, tag]
    ch = Channel.create("same_channel")
    ch.put(tag)
    assert ch.get(timeout=30) == tag
    groups = cluster.session.list_groups()
    assert groups == ["Channel.same_channel", "same_name"], groups
    print("ISOLATED OK", tag, flush=True)
    cluster.shutdown()


if __name__ == "__main__":
    main()
