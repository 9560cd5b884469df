"""GPU bandwidth table for ``check.sh``: send_tensor from 1 MiB to 1 GiB.

Two plain processes and a torch TCPStore (no Ray, no launcher).  Per size:
a raw device-to-device copy (one process) and CUDA IPC (the receiver copies
from the sender's tensor mapped into its address space; one GPU is enough),
then, with two GPUs, raw ``torch.distributed`` NCCL send/recv and the
``torch-nccl`` and ``cupy-nccl`` transports' ``send_tensors`` /
``recv_tensors_into``.  All in the same run, so the ratios compare like with
like.  Each part that cannot run prints ``SKIP <part>: <reason>``.

Timing: the receiver takes one warm-up message, then times N messages and a
device synchronise; GB/s = bytes / seconds.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
import traceback

MiB = 1 << 20
SIZES = [1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB, 1024 * MiB]
SETUP_TIMEOUT = 120.0


def iterations(size: int) -> int:
    return max(3, min(50, (2 << 30) // size))


def barrier(store, key: str) -> None:
    store.add(key, 1)
    deadline = time.monotonic() + SETUP_TIMEOUT
    while int(store.add(key, 0)) < 2:
        if time.monotonic() > deadline:
            raise TimeoutError(f"barrier {key}: the other process did not arrive within {SETUP_TIMEOUT:.0f} s")
        time.sleep(0.0005)


def timed_recv(recv_one, n: int) -> float:
    import torch

    recv_one()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        recv_one()
    torch.cuda.synchronize()
    return time.perf_counter() - start


# -- the parts -------------------------------------------------------------------------------------
def part_ipc(rank, store, results):
    """Sender shares one buffer per size through a CUDA IPC handle; receiver copies from it."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    torch.cuda.set_device(0)
    for size in SIZES:
        n = iterations(size)
        if rank == 0:
            src = torch.full((size,), 7, dtype=torch.uint8, device="cuda:0")
            torch.cuda.synchronize()
            fn, args = reduce_tensor(src)
            store.set(f"ipc/{size}", pickle.dumps((fn, args)))
            barrier(store, f"ipc/done/{size}")  # keep src alive until the receiver is done
        else:
            fn, args = pickle.loads(store.get(f"ipc/{size}"))
            mapped = fn(*args)
            dst = torch.empty(size, dtype=torch.uint8, device="cuda:0")
            secs = timed_recv(lambda: dst.copy_(mapped, non_blocking=True), n)
            assert int(dst[-1]) == 7
            results[("cuda-ipc", size)] = size * n / secs
            del mapped
            barrier(store, f"ipc/done/{size}")


def part_raw_nccl(rank, store, results):
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", store=dist.PrefixStore("raw", store), rank=rank, world_size=2,
                            device_id=torch.device("cuda", rank))
    try:
        for size in SIZES:
            n = iterations(size)
            buf = torch.full((size,), rank + 1, dtype=torch.uint8, device=f"cuda:{rank}")
            barrier(store, f"raw/{size}")
            if rank == 0:
                for _ in range(n + 1):
                    dist.send(buf, 1)
                torch.cuda.synchronize()
            else:
                secs = timed_recv(lambda: dist.recv(buf, 0), n)
                assert int(buf[-1]) == 1
                results[("raw-nccl", size)] = size * n / secs
            barrier(store, f"raw/end/{size}")
    finally:
        dist.destroy_process_group()


def part_transport(name, rank, store, results):
    import queue

    import torch

    from rlinf.scheduler.plugins import get_registry

    torch.cuda.set_device(rank)
    entry = get_registry().transport(name, "cuda")
    reason = entry.unusable_reason()
    if reason:
        raise RuntimeError(f"SKIP {name}: {reason}")
    transport = entry.descriptor.factory()
    try:
        if rank == 1:
            accepted = queue.Queue()
            endpoint = transport.listen(lambda link, hello: accepted.put(link), "127.0.0.1")
            store.set(f"{name}/endpoint", json.dumps(endpoint))
            link = accepted.get(timeout=SETUP_TIMEOUT)
        else:
            endpoint = json.loads(store.get(f"{name}/endpoint"))
            link = transport.connect(endpoint, b"bandwidth", time.monotonic() + SETUP_TIMEOUT)
        for size in SIZES:
            n = iterations(size)
            buf = torch.full((size,), rank + 1, dtype=torch.uint8, device=f"cuda:{rank}")
            barrier(store, f"{name}/{size}")
            if rank == 0:
                for _ in range(n + 1):
                    link.send_tensors([buf], time.monotonic() + SETUP_TIMEOUT)
                torch.cuda.synchronize()
            else:
                secs = timed_recv(lambda: link.recv_tensors_into([buf], time.monotonic() + SETUP_TIMEOUT), n)
                assert int(buf[-1]) == 1
                results[(name, size)] = size * n / secs
            barrier(store, f"{name}/end/{size}")
    finally:
        transport.close()


PARTS = {
    "cuda-ipc": (1, part_ipc),
    "raw-nccl": (2, part_raw_nccl),
    "torch-nccl": (2, lambda r, s, res: part_transport("torch-nccl", r, s, res)),
    "cupy-nccl": (2, lambda r, s, res: part_transport("cupy-nccl", r, s, res)),
}


def rank_main(rank: int, port: int, parts: list) -> None:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, 3, False, timeout=__import__("datetime").timedelta(seconds=SETUP_TIMEOUT))
    for part in parts:
        results: dict = {}
        try:
            PARTS[part][1](rank, store, results)
            outcome = {"ok": True, "results": [[k[0], k[1], v] for k, v in results.items()]}
        except Exception as exc:
            text = str(exc)
            outcome = {"ok": False, "error": text if text.startswith("SKIP") else
                       f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
        store.set(f"outcome/{part}/{rank}", json.dumps(outcome))
        if not outcome["ok"]:
            return  # the other rank's waits fail on their deadlines and report too


def device_copy() -> dict:
    import torch

    out = {}
    for size in SIZES:
        n = iterations(size)
        src = torch.empty(size, dtype=torch.uint8, device="cuda:0")
        dst = torch.empty_like(src)
        out[size] = size * n / timed_recv(lambda: dst.copy_(src, non_blocking=True), n)
        del src, dst
    return out


def main() -> int:
    import datetime

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not torch.cuda.is_available():
        print("SKIP bandwidth table: no CUDA device is visible (torch.cuda.is_available() is False)")
        return 0
    ngpu = torch.cuda.device_count()
    parts = []
    for part, (need, _) in PARTS.items():
        if ngpu < need:
            print(f"SKIP {part}: needs {need} GPUs, {ngpu} visible (NCCL cannot connect two processes on one GPU)")
        else:
            parts.append(part)
    copy = device_copy()
    store = dist.TCPStore("127.0.0.1", 0, 3, True, timeout=datetime.timedelta(seconds=SETUP_TIMEOUT),
                          wait_for_workers=False)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(r, store.port, parts)) for r in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        if p.is_alive():
            p.kill()
            print(f"FAIL bandwidth rank {procs.index(p)} did not finish in time")
    table: dict = {}
    failed = False
    for part in parts:
        for rank in (0, 1):
            key = f"outcome/{part}/{rank}"
            if not store.check([key]):
                continue
            outcome = json.loads(store.get(key))
            if outcome["ok"]:
                for name, size, gbs in outcome["results"]:
                    table[(name, size)] = gbs
            elif outcome["error"].startswith("SKIP"):
                print(outcome["error"])
                break
            else:
                failed = True
                print(f"FAIL {part} (rank {rank}): {outcome['error']}")
                break
    names = ["copy"] + [p for p in PARTS if any((p, s) in table for s in SIZES)]
    print(f"\n{'size':>9} " + " ".join(f"{n + ' GB/s':>16}" for n in names) + "   ratios")
    for size in SIZES:
        row = [copy[size] / 1e9] + [table.get((n, size), float("nan")) / 1e9 for n in names[1:]]
        ratios = []
        if ("cuda-ipc", size) in table:
            ratios.append(f"ipc/copy={table[('cuda-ipc', size)] / copy[size]:.2f}")
        for n in ("torch-nccl", "cupy-nccl"):
            if (n, size) in table and ("raw-nccl", size) in table:
                ratios.append(f"{n}/raw={table[(n, size)] / table[('raw-nccl', size)]:.2f}")
        print(f"{size // MiB:>6} MiB " + " ".join(f"{v:>16.1f}" for v in row) + "   " + " ".join(ratios))
    # the targets: >= 0.9x raw NCCL at 256 MiB and up, CUDA IPC >= 0.8x a device copy
    for size in (s for s in SIZES if s >= 256 * MiB):
        for n in ("torch-nccl", "cupy-nccl"):
            if (n, size) in table and ("raw-nccl", size) in table:
                r = table[(n, size)] / table[("raw-nccl", size)]
                print(f"TARGET {n} {size // MiB} MiB >= 0.9x raw NCCL: {'met' if r >= 0.9 else 'MISSED'} ({r:.2f})")
        if ("cuda-ipc", size) in table:
            r = table[("cuda-ipc", size)] / copy[size]
            print(f"TARGET cuda-ipc {size // MiB} MiB >= 0.8x device copy: {'met' if r >= 0.8 else 'MISSED'} ({r:.2f})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
