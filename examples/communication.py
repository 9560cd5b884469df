"""The seed's second example on CPU: two groups exchange messages, tensors,
lists and dicts of tensors, raw tensors, synchronously and asynchronously.

    python examples/communication.py
"""

import asyncio

import torch

from rlinf.scheduler import Cluster, NodePlacementStrategy, Worker

SEND_GROUP_NAME = "send_worker_group"
RECV_GROUP_NAME = "recv_worker_group"


def device():
    return torch.cuda.current_device() if torch.cuda.is_available() else "cpu"


class SendWorker(Worker):
    def __init__(self):
        super().__init__()

    def hello_recv(self):
        # 1. Send a message (any serializable object) to the RecvWorker of the same rank.
        msg = f"Hello from SendWorker Rank {self._rank}!"
        self.send(msg, dst_group_name=RECV_GROUP_NAME, dst_rank=self._rank)
        # 2. Receive a reply from the RecvWorker of the same rank.
        reply = self.recv(src_group_name=RECV_GROUP_NAME, src_rank=self._rank)
        # 3. Tensors, lists of tensors and dicts of tensors travel as tensors.
        dst_rank = (self._rank + 1) % self._world_size
        self.send(torch.ones(size=(1, 1), device=device()), dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank)
        tensor_list = [torch.tensor(1.0, device=device()) for _ in range(4)]
        self.send(tensor_list, dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank)
        tensor_dict = {"tensor1": torch.tensor(2.0, device=device()), "tensor2": torch.tensor(3.0, device=device())}
        self.send(tensor_dict, dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank)
        # 4. A tensor without metadata when the receiver knows its shape and dtype.
        self.send_tensor(torch.ones(size=(2, 1), device=device()), dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank)
        return reply

    def hello_recv_async(self):
        # 1. Send a tensor asynchronously to the next rank.
        dst_rank = (self._rank + 1) % self._world_size
        work = self.send(torch.ones(size=(3, 1), device=device()), dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank, async_op=True)
        work.wait()

        # 2. Send asynchronously and await completion with asyncio.
        async def send_tensor_async():
            work = self.send(torch.ones(size=(4, 1), device=device()), dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank, async_op=True)
            await work.async_wait()

        asyncio.run(send_tensor_async())


class RecvWorker(Worker):
    def __init__(self):
        super().__init__()

    def hello_recv(self):
        msg = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=self._rank)
        self.send(f"Hello from RecvWorker Rank {self._rank}!", dst_group_name=SEND_GROUP_NAME, dst_rank=self._rank)
        src_rank = (self._rank - 1) % self._world_size
        tensor = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank)
        tensor_list = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank)
        tensor_dict = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank)
        buffer = torch.empty(size=(2, 1), device=device())
        self.recv_tensor(buffer, src_group_name=SEND_GROUP_NAME, src_rank=src_rank)
        return msg, tensor, tensor_list, tensor_dict, buffer

    def hello_recv_async(self):
        src_rank = (self._rank - 1) % self._world_size
        tensor = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank, async_op=True).wait()

        async def recv_tensor_async():
            work = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank, async_op=True)
            return await work.async_wait()

        return tensor, asyncio.run(recv_tensor_async())


def main():
    cluster = Cluster(num_nodes=1)
    placement = None if cluster.num_accelerators >= 2 else NodePlacementStrategy([0, 0])
    send_group = SendWorker.create_group().launch(cluster=cluster, placement_strategy=placement, name=SEND_GROUP_NAME)
    recv_group = RecvWorker.create_group().launch(cluster=cluster, placement_strategy=placement, name=RECV_GROUP_NAME)

    res = send_group.hello_recv()
    received = recv_group.hello_recv().wait()
    replies = res.wait()
    for rank, (msg, tensor, tensor_list, tensor_dict, buffer) in enumerate(received):
        print(f"recv rank {rank}: {msg!r}, {tensor.tolist()}, {[t.item() for t in tensor_list]}, "
              f"{ {k: v.item() for k, v in tensor_dict.items()} }, {buffer.flatten().tolist()}")
        assert msg == f"Hello from SendWorker Rank {rank}!"
        assert tensor_dict["tensor2"].item() == 3.0 and buffer.sum().item() == 2.0
    print("replies:", replies)
    assert replies == [f"Hello from RecvWorker Rank {r}!" for r in range(len(replies))]

    res = send_group.hello_recv_async()
    received = recv_group.hello_recv_async().wait()
    res.wait()
    print("async shapes:", [(tuple(a.shape), tuple(b.shape)) for a, b in received])
    assert all(tuple(a.shape) == (3, 1) and tuple(b.shape) == (4, 1) for a, b in received)


if __name__ == "__main__":
    main()
