"""Listeners outlive a moment of file-descriptor exhaustion, without spinning a core while it lasts.

A child process runs the status listener and the cpu transport's listener,
then takes every descriptor its (lowered) limit allows.  While it has none,
the test connects to both: accept() fails with EMFILE.  The child measures the
CPU time all its threads use over that window, gives the descriptors back, and
the test checks that both listeners serve again.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

from rlinf.scheduler.base import security
from rlinf.scheduler.runtime import status_server
from rlinf.scheduler.transports.cpu_transport import CpuTransport

#: seconds the child stays without descriptors while the test's connections wait in the backlogs
WINDOW = 1.5
#: CPU seconds the child may use over that window (a spinning accept loop uses about all of it)
MOST_CPU = 0.3

CHILD = textwrap.dedent(
    """
    import json, os, resource, sys, time
    from rlinf.scheduler.runtime import status_server
    from rlinf.scheduler.transports.cpu_transport import CpuTransport
    from rlinf.testing._echo_peer import echo_serve

    status = status_server.start("127.0.0.1")
    cpu = CpuTransport().listen(echo_serve, "127.0.0.1")
    print(json.dumps({"status": status, "cpu": cpu}), flush=True)
    window = float(sys.argv[1])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 256), hard))
    sys.stdin.readline()  # "exhaust"
    held = []
    try:
        while True:
            held.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    print("exhausted", flush=True)
    sys.stdin.readline()  # the test's connections wait in the listeners' backlogs now
    t0, c0 = time.monotonic(), time.process_time()
    time.sleep(window)
    used = time.process_time() - c0
    for fd in held:
        os.close(fd)
    print(json.dumps({"cpu": used, "wall": time.monotonic() - t0, "held": len(held)}), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    """
)


def test_listeners_back_off_while_descriptors_run_out_and_serve_again():
    security.cluster_secret()  # the child inherits it: the cpu transport's handshake needs the same one
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(WINDOW)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    waiting: list[socket.socket] = []
    transport = CpuTransport()
    try:
        endpoints = json.loads(proc.stdout.readline())
        proc.stdin.write("exhaust\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "exhausted"
        # the kernel completes these connections; the listeners' accept() fails while the child has no descriptor
        for host, port in ((endpoints["status"]["host"], endpoints["status"]["port"]), endpoints["cpu"]["tcp"]):
            waiting.append(socket.create_connection((host, port), timeout=5))
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        waiting.append(unix)
        unix.settimeout(5)
        unix.connect("\0" + endpoints["cpu"]["unix"])
        proc.stdin.write("go\n")
        proc.stdin.flush()
        measured = json.loads(proc.stdout.readline())
        assert measured["held"] > 0
        assert measured["cpu"] < MOST_CPU, (
            f"the child used {measured['cpu']:.2f} s of CPU in {measured['wall']:.2f} s without descriptors"
        )
        # descriptors are back: both listeners serve again (within their longest back-off)
        snap = status_server.query(endpoints["status"], timeout=5)
        assert snap["pid"] == proc.pid
        link = transport.connect({**endpoints["cpu"], "host": "elsewhere"}, b"hi", time.monotonic() + 5)  # over TCP
        link.send([b"hello?", b"x"], time.monotonic() + 5)
        _raw, frames = link.recv(time.monotonic() + 5)
        assert [bytes(f) for f in frames] == [b"hi", b"hello?", b"x"]
        local = transport.connect(endpoints["cpu"], b"local", time.monotonic() + 5)  # over the Unix socket
        local.send([b"hello?"], time.monotonic() + 5)
        assert [bytes(f) for f in local.recv(time.monotonic() + 5)[1]] == [b"local", b"hello?"]
    finally:
        for s in waiting:
            s.close()
        transport.close()
        proc.stdin.close()
        proc.kill()
        proc.wait(10)
