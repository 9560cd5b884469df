"""The seed's GPU examples, one worker per GPU, for ``check.sh`` (run under the MPI launcher):

    mpiexec -n $((1 + 2 * NGPU)) python -m rlinf.mpi benchmarks/gpu/seed_examples.py NGPU

1. every worker calls ``torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))``,
   joins an NCCL process group and all_reduces a CUDA tensor of ones;
2. two groups on the same GPUs exchange CUDA tensors, lists and dicts of them
   with send/recv and a raw CUDA tensor with send_tensor/recv_tensor; each
   tensor must arrive on the receiver's current device.
"""

import os
import sys

import torch

from rlinf.scheduler import Cluster, PackedPlacementStrategy, Worker


class AllReduce(Worker):
    def __init__(self):
        super().__init__()
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend="nccl")

    def run(self):
        t = torch.ones((1, 1), dtype=torch.float32, device=torch.cuda.current_device())
        torch.distributed.all_reduce(t)
        return float(t.item()), int(os.environ["LOCAL_RANK"]), os.environ.get("CUDA_VISIBLE_DEVICES")


class Sender(Worker):
    def __init__(self):
        super().__init__()
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))

    def go(self, dst_group):
        dev = torch.cuda.current_device()
        self.send(torch.full((1, 1), 1.0, device=dev), dst_group, self._rank)
        self.send([torch.tensor(2.0, device=dev), torch.arange(3, device="cpu")], dst_group, self._rank)
        self.send({"a": torch.tensor(3.0, device=dev)}, dst_group, self._rank)
        self.send_tensor(torch.full((2, 1), 4.0, device=dev), dst_group, self._rank)
        return dev


class Receiver(Worker):
    def __init__(self):
        super().__init__()
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))

    def go(self, src_group):
        dev = torch.cuda.current_device()
        one = self.recv(src_group, self._rank)
        lst = self.recv(src_group, self._rank)
        dct = self.recv(src_group, self._rank)
        raw = torch.empty((2, 1), device=dev)
        self.recv_tensor(raw, src_group, self._rank)
        assert one.is_cuda and one.device.index == dev and float(one) == 1.0, one
        assert lst[0].is_cuda and float(lst[0]) == 2.0 and lst[1].device.type == "cpu", lst
        assert dct["a"].is_cuda and float(dct["a"]) == 3.0, dct
        assert float(raw.sum()) == 8.0, raw
        return dev


def main(ngpu: int):
    cluster = Cluster(num_nodes=1)
    placement = PackedPlacementStrategy(0, ngpu - 1)
    g = AllReduce.create_group().launch(cluster=cluster, placement_strategy=placement, name="seed_all_reduce")
    res = g.run().wait()
    g.stop()
    assert all(r[0] == float(ngpu) for r in res), res
    print(f"SEED all_reduce over {ngpu} GPU worker(s): ok {res}", flush=True)
    s = Sender.create_group().launch(cluster=cluster, placement_strategy=placement, name="seed_send")
    r = Receiver.create_group().launch(cluster=cluster, placement_strategy=placement, name="seed_recv")
    sent = s.go("seed_recv")
    got = r.go("seed_send").wait()
    sent.wait()
    print(f"SEED CUDA send/recv/send_tensor between {ngpu}+{ngpu} workers: ok (devices {got})", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else torch.cuda.device_count())
