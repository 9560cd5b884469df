"""Ports and names: rendezvous never races for a port, and independent
programs on one machine never see each other's groups."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from rlinf.scheduler import NodePlacementStrategy, Worker
from rlinf.scheduler.runtime.host import reserve_port


def test_reserved_port_is_held_but_usable_by_the_rendezvous_server():
    sock, port = reserve_port("127.0.0.1")
    try:
        other = socket.socket()
        with pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # nobody else can take it
        other.close()
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))  # what torch's TCPStore does: it gets the port
        server.listen(1)
        server.close()
    finally:
        sock.close()


class PortWorker(Worker):
    def __init__(self):
        super().__init__()

    def port(self):
        return os.environ["MASTER_PORT"]


def test_concurrent_launches_get_distinct_master_ports(cluster):
    groups, errors = [], []

    def launch(i):
        try:
            groups.append(PortWorker.create_group().launch(cluster, NodePlacementStrategy([0]), name=f"ports_{i}"))
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert not errors
        ports = [g.port().wait()[0] for g in groups]
        assert len(set(ports)) == 4
    finally:
        for g in groups:
            g.stop()


@pytest.mark.timeout(300)
def test_two_programs_with_the_same_names_do_not_see_each_other():
    program = os.path.join(os.path.dirname(__file__), "isolation_program.py")
    dirs = [tempfile.mkdtemp(prefix="rliso") for _ in range(2)]
    try:
        procs = [subprocess.Popen([sys.executable, program, tag, d], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for tag, d in zip(("alpha", "beta"), dirs)]
        outs = [p.communicate(timeout=240) for p in procs]
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    for (out, err), tag in zip(outs, ("alpha", "beta")):
        assert f"ISOLATED OK {tag}" in out, out[-2000:] + err[-4000:]
