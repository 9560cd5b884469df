"""The seed's first example on CPU: a group of four workers, a gloo all_reduce
through the default ``env://`` rendezvous, and ``execute_on``.

    python examples/worker_group.py
"""

import os

import torch

from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker


class MyWorker(Worker):
    def __init__(self):
        super().__init__()

    def initialize(self):
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
        test_tensor = torch.ones(size=(1, 1), dtype=torch.float32, device=device)
        torch.distributed.all_reduce(test_tensor)
        return test_tensor

    def hello(self):
        return self._rank


def main():
    cluster = Cluster(num_nodes=1)
    # one worker per GPU when there are GPUs; four CPU workers on node 0 otherwise
    placement = None if cluster.num_accelerators >= 4 else NodePlacementStrategy([0] * 4)
    my_worker_group = MyWorker.create_group().launch(cluster=cluster, placement_strategy=placement, name="my_worker_group")
    result = my_worker_group.initialize().wait()[0]
    print("all_reduce over 4 workers:", result)
    assert result.item() == 4.0
    # This will execute the hello method only on ranks 0 and 3.
    ranks = my_worker_group.execute_on(0, 3).hello().wait()
    print("execute_on(0, 3):", ranks)
    assert ranks == [0, 3]


if __name__ == "__main__":
    main()
