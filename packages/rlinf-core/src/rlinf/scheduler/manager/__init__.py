"""RLinf's ``rlinf.scheduler.manager`` path: ``Tracer`` (see ``manager.tracer``).

Layer: the public API; it may import ``tracing`` and the layers below.
"""

from .tracer import Tracer

__all__ = ["Tracer"]
