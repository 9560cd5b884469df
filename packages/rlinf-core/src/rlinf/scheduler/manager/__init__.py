"""RLinf's ``rlinf.scheduler.manager`` path: ``Tracer`` (see ``manager.tracer``)."""

from .tracer import Tracer

__all__ = ["Tracer"]
