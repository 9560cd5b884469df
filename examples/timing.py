"""The seed's timer examples: a context manager and a decorator; durations are
reduced across the group (max by default) and include nested tags.

    python examples/timing.py
"""

import time

from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker


class MyWorker(Worker):
    def __init__(self):
        super().__init__()

    @Worker.timer("run_training")
    def run_training(self, batch):
        return self.train_step(batch)

    @Worker.timer("train_step")
    def train_step(self, batch):
        with self.worker_timer("forward"):
            time.sleep(0.01 * (self._rank + 1))
        return sum(batch)


def main():
    cluster = Cluster(num_nodes=1)
    worker_group = MyWorker.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="timed_group")
    handle = worker_group.run_training([1, 2, 3])
    result = handle.wait()
    timing = handle.consume_durations()  # dict: tag -> duration, max over ranks
    print("result:", result)
    print("timing:", {k: round(v, 4) for k, v in timing.items()})
    assert result == [6, 6] and {"run_training", "train_step", "forward"} <= set(timing)
    assert timing["run_training"] >= timing["train_step"] >= timing["forward"] >= 0.02


if __name__ == "__main__":
    main()
