"""The README's quick start: a group call, send/recv, a channel, a timer and the group's timings.

    python examples/quickstart.py
"""

import time

from rlinf.scheduler import Channel, Cluster, NodePlacementStrategy, Worker


class Trainer(Worker):
    def __init__(self):
        super().__init__()

    @Worker.timer("step")  # time the whole method under the tag "step"
    def step(self, lr):
        with self.worker_timer("compute"):  # or time a block
            time.sleep(0.01)
        if self._rank == 0:  # send any picklable object (tensors travel as raw bytes)
            self.send({"lr": lr, "from": self._rank}, dst_group_name="trainers", dst_rank=1)
            return "sent"
        return self.recv(src_group_name="trainers", src_rank=0)

    def produce(self, n):
        channel = self.connect_channel("rollouts")  # a FIFO queue any process can reach
        for i in range(n):
            channel.put((self._rank, i))
        return n


cluster = Cluster(num_nodes=1)
rollouts = Channel.create("rollouts", maxsize=8)
group = Trainer.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="trainers")

result = group.step(lr=0.1)  # runs on every rank at once; returns at once
print(result.wait())  # ['sent', {'lr': 0.1, 'from': 0}]
print(sorted(result.consume_durations()))  # ['compute', 'step']: slowest rank's seconds

group.execute_on(1).produce(3).wait()  # only rank 1 this time
print([rollouts.get() for _ in range(3)])  # [(1, 0), (1, 1), (1, 2)]
