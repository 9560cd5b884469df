"""What a plugin hands to rlinf: small descriptors, cheap to build.

Descriptors are returned by the hooks in ``hookspecs``.  Building one must not
import the backend's heavy dependencies: ``check`` says whether the backend is
usable on this machine and ``factory`` builds it only when it is chosen.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional


def _always_usable() -> Optional[str]:
    return None


@dataclass
class LauncherPlugin:
    """A way to start worker processes (Ray, MPI, ...).

    ``factory()`` returns an object implementing ``rlinf.scheduler.launcher.Launcher``.
    ``check()`` returns ``None`` when usable here, else a one-line reason.
    Among usable launchers the highest ``priority`` is the default.
    """

    name: str
    factory: Callable[[], object]
    priority: int = 0
    check: Callable[[], Optional[str]] = _always_usable
    description: str = ""


@dataclass
class TransportPlugin:
    """A way to move buffers between two workers.

    ``factory()`` returns an object implementing ``rlinf.scheduler.p2p.transport.Transport``.
    ``devices`` names the tensor devices it serves (``"cpu"``, ``"cuda"``); for each
    device the usable transport with the highest ``priority`` is the default.
    """

    name: str
    factory: Callable[[], object]
    priority: int = 0
    devices: tuple[str, ...] = ("cpu",)
    check: Callable[[], Optional[str]] = _always_usable
    description: str = ""
    extra: dict = field(default_factory=dict)
