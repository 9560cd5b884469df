"""Where an embedded Ray cluster keeps its files, and whom its ports are open to.

Files.  Ray makes its temp dir and, inside it, the session, ``sockets``,
``logs`` and ``runtime_resources`` directories with mode 0777 (no sticky
bit), and chmods its temp dir to 0777 on every start.  In a directory that
other users can reach, any of them could rename ``sockets/raylet`` and bind
its own socket in its place, or create the temp dir first.  So Ray never gets
a directory of its own choosing in a shared place: it gets ``ray`` inside a
per-user directory (``<base>/rlinf-ray-<uid>``, made with mode 0700 and
checked before each use), which no other user can enter, whatever Ray then
makes inside.  Paths stay short: Ray's unix socket paths must fit in 107
bytes.

Ports.  ``ray.init(_node_ip_address="127.0.0.1")`` makes a recent Ray bind
its servers to loopback (measured with 2.60).  Older Ray versions bind some of
them to every address whatever the node address (Ray moved its servers to the
node address during 2025-2026, ray-project/ray#55484 and #59852);
``check_loopback`` finds such a listener among the cluster's processes, so
that the driver stops the cluster instead of running it open to the network.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from typing import Iterable, Optional

from rlinf.scheduler.base import security

#: the subdirectory of the private directory that Ray gets as its temp dir (Ray makes it 0777)
RAY_SUBDIR = "ray"


def ray_temp_dir(base: Optional[str] = None) -> str:
    """Ray's temp dir for an embedded cluster: ``<base>/rlinf-ray-<uid>/ray``, made and checked.

    ``base`` is the directory the user chose (``temp_dir=``, ``RLINF_RAY_TEMP_DIR``), else the
    system's temp dir.  A chosen directory is treated like the system's, not handed to Ray as it
    is: Ray would make it 0777 on every start, so it could never stay private, and users often
    point it at a scratch directory shared with others.  Raises ``PermissionError`` (saying what
    to do) when the private directory is not private (``security.private_dir``, which also refuses a
    parent where another user could replace it, and a link on the way that another user made).  The
    path returned has the links in ``base`` resolved (``private_dir`` returns it so): Ray keeps the
    string for its whole session, and a link would be followed again on each use, wherever it then
    points.  The resolved path may be longer than ``base``: Ray's socket paths under it must fit in
    107 bytes."""
    base = os.path.abspath(base or tempfile.gettempdir())
    private = security.private_dir(os.path.join(base, f"rlinf-ray-{os.geteuid()}"),
                                   hint="or choose another base directory with temp_dir= or RLINF_RAY_TEMP_DIR")
    return os.path.join(private, RAY_SUBDIR)


# -- listening ports ----------------------------------------------------------------------------------
def listening_tcp() -> list[tuple]:
    """``(address, port, uid, inode)`` of every TCP socket listening in this network namespace (``/proc``)."""
    found = []
    for table, family in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 6)):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 10 or fields[3] != "0A":  # LISTEN
                continue
            hex_addr, _, hex_port = fields[1].rpartition(":")
            raw = bytes.fromhex(hex_addr)
            # /proc writes each 32-bit word of the address in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addr = ipaddress.IPv4Address(raw) if family == 4 else ipaddress.IPv6Address(raw)
            found.append((addr, int(hex_port, 16), int(fields[7]), int(fields[9])))
    return found


def _listening_sockets() -> dict[int, str]:
    """Socket inode -> ``address:port`` of every TCP socket listening in this network namespace."""
    return {inode: f"{addr}:{port}" for addr, port, _uid, inode in listening_tcp()}


def is_loopback(address: str) -> bool:
    """Whether ``address:port`` (as ``_listening_sockets`` writes it) is on a loopback address."""
    addr = ipaddress.ip_address(address.rpartition(":")[0])
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped or addr).is_loopback


def listeners(pids: Iterable[int]) -> list[tuple[int, str, str]]:
    """``(pid, process name, address:port)`` of each TCP socket the processes ``pids`` listen on."""
    sockets = _listening_sockets()
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                name = f.read().strip()
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and int(link[8:-1]) in sockets:
                out.append((pid, name, sockets[int(link[8:-1])]))
    return out


def check_loopback(session_dir: str) -> None:
    """Raise ``RuntimeError`` naming every listener of the cluster of ``session_dir`` (its daemons
    and this driver) that is not on a loopback address."""
    from .watchdog import session_processes

    exposed = [f"{name} (pid {pid}) on {addr}"
               for pid, name, addr in listeners({*session_processes(session_dir), os.getpid()})
               if not is_loopback(addr)]
    if exposed:
        import ray

        raise RuntimeError(
            f"the embedded Ray cluster listens on addresses other than loopback: {', '.join(exposed)}; "
            f"Ray {ray.__version__} ignores the loopback node address for these servers.  Upgrade Ray "
            f"(recent versions bind to the node address; 2.52 and later check tokens), or run `ray start` on a "
            f"firewalled machine and join it with RAY_ADDRESS"
        )
