"""What this machine needs at the least to move bytes, measured in the run that compares against it.

Each floor is plain code with no protocol: the least any transport doing the same
work can cost on these cores and this memory.  A benchmark prints the floor of
its work beside rlinf and its baselines, measured in the same run, since
absolute times drift with the machine's load.

* ``memcpy_floor``: one warm ``dst.copy_(src)`` of a size in one process.
* ``copy_floor``: N processes each copying a payload out of one warm shared
  mapping into their own warm buffers, all at once.
* ``tcp_floor``: N plain sender processes each streaming bytes over loopback
  TCP into a warm buffer of one of N plain receiver processes, all at once.
"""

from __future__ import annotations

import os
import statistics
import time

MiB = 1 << 20


def memcpy_floor(nbytes: int, repeat: int = 7) -> float:
    """Seconds of one warm copy of ``nbytes``: ``dst.copy_(src)`` on pre-touched torch tensors in this
    process, on one thread (a ``memcpy``), best of ``repeat`` after one untimed copy.

    Args:
        nbytes: the size copied (rounded down to whole float32 elements).
        repeat: timed copies; the fastest is returned.

    Raises:
        RuntimeError: the tensors cannot be allocated.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(max(1, nbytes // 4))
        dst = torch.zeros_like(src)  # both written once: every page faulted in
        dst.copy_(src)
        best = float("inf")
        for _ in range(repeat):
            start = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - start)
        return best
    finally:
        torch.set_num_threads(threads)


def _state_dict_arrays(size: int, tensors: int) -> list:
    """``tensors`` warm uint8 views of torch tensors, ``size`` bytes in all, as a receiver's state dict."""
    import numpy as np
    import torch

    per = max(1, size // tensors // 4)
    return [torch.zeros(per).numpy().view(np.uint8) for _ in range(tensors)]


def _copy_child(fd: int, size: int, tensors: int, start, done) -> None:
    import mmap

    import numpy as np

    src = np.frombuffer(mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ), dtype=np.uint8)
    dsts = _state_dict_arrays(size, tensors) if tensors > 1 else [np.empty(size, dtype=np.uint8)]

    def copy():
        pos = 0
        for d in dsts:
            np.copyto(d, src[pos : pos + d.nbytes])
            pos += d.nbytes

    copy()  # warm: both mappings faulted in, as a receiver's kept mapping and state dict are
    for _ in range(2):
        start.wait(120)
        copy()
        done.wait(120)


def _timed_rounds(procs: list, start, done, rounds: int = 2) -> list:
    """Start ``procs``; time each of ``rounds`` rounds from the ``start`` barrier to the ``done`` one (every
    wait bounded: a process that fails breaks the barriers within 120 s); join them."""
    for p in procs:
        p.start()
    times = []
    try:
        for _ in range(rounds):
            start.wait(120)
            t0 = time.perf_counter()
            done.wait(120)
            times.append(time.perf_counter() - t0)
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
                p.join(10)
    return times


def copy_floor(size_mb: int, n: int, tensors: int = 1) -> float:
    """Seconds for ``n`` processes to copy ``size_mb`` MiB each out of one warm shared mapping at once, into
    ``tensors`` warm tensors each (median of 2 rounds).

    Args:
        size_mb: the payload, in MiB.
        n: the processes copying at once (the receivers of a broadcast).
        tensors: how many tensors each process's destination is split into (a state dict's).

    Raises:
        threading.BrokenBarrierError: a copying process failed or hung for 120 s.
        OSError: no anonymous memory file could be made.
    """
    import multiprocessing as mp

    import numpy as np

    size = size_mb * MiB
    fd = os.memfd_create("bench-copy-floor")
    try:
        os.ftruncate(fd, size)
        with open(f"/proc/self/fd/{fd}", "r+b", buffering=0) as f:
            f.write(np.ones(size, dtype=np.uint8).tobytes())
        ctx = mp.get_context("fork")
        start, done = ctx.Barrier(n + 1), ctx.Barrier(n + 1)
        procs = [ctx.Process(target=_copy_child, args=(fd, size, tensors, start, done), daemon=True)
                 for _ in range(n)]
        return statistics.median(_timed_rounds(procs, start, done))
    finally:
        os.close(fd)


def _tcp_receiver(listener, size: int, k: int, rounds: int, start, done) -> None:
    import numpy as np

    conn, _ = listener.accept()
    conn.settimeout(120)
    arr = np.empty(size, dtype=np.uint8)
    arr.fill(0)  # warm, as a receiver's existing tensor is
    buf = memoryview(arr)
    for _ in range(rounds):
        start.wait(120)
        for _ in range(k):
            pos = 0
            while pos < size:
                got = conn.recv_into(buf[pos:], size - pos)
                if not got:
                    raise ConnectionError("sender closed early")
                pos += got
        done.wait(120)


def _tcp_sender(port: int, payload, k: int, rounds: int, start, done) -> None:
    import socket

    payload = memoryview(payload)  # the parent's array, shared by every sender (fork; never written)
    sock = socket.create_connection(("127.0.0.1", port), timeout=120)
    for _ in range(rounds):
        start.wait(120)
        for _ in range(k):
            sock.sendall(payload)
        done.wait(120)
    sock.close()


def tcp_floor(nbytes: int, n: int = 1, k: int = 1, rounds: int = 2) -> list:
    """Seconds of each of ``rounds`` rounds in which ``n`` plain sender processes each stream ``k`` messages of
    ``nbytes`` over loopback TCP into a warm buffer of one of ``n`` plain receiver processes, all at once.

    Args:
        nbytes: one message's size.
        n: sender/receiver pairs streaming at once.
        k: messages per pair and round (a round ends when every receiver has all of its own).
        rounds: timed rounds, on the same connections (later ones find warm socket buffers).

    Raises:
        threading.BrokenBarrierError: a process failed or hung for 120 s.
        OSError: no loopback socket could be made.
    """
    import multiprocessing as mp
    import socket

    import numpy as np

    ctx = mp.get_context("fork")
    payload = np.ones(nbytes, dtype=np.uint8)
    start, done = ctx.Barrier(2 * n + 1), ctx.Barrier(2 * n + 1)
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(n)]
    try:
        procs = [ctx.Process(target=_tcp_receiver, args=(lst, nbytes, k, rounds, start, done), daemon=True)
                 for lst in listeners]
        procs += [ctx.Process(target=_tcp_sender, args=(lst.getsockname()[1], payload, k, rounds, start, done),
                              daemon=True) for lst in listeners]
        return _timed_rounds(procs, start, done, rounds)
    finally:
        for lst in listeners:
            lst.close()
