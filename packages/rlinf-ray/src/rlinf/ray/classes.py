"""One class identity for Ray's pickler and core's.

Classes from ``__main__`` or a test module travel to workers by value.
cloudpickle keeps their identity across round trips with a class tracker:
a class pickled by value carries an id, the receiver records the class it
rebuilt under that id, and a class coming back with a known id resolves to
the receiver's own class.  So a result of the driver's class comes back as
an instance of exactly that class (``isinstance`` holds), while workers get
by-value copies.

Ray pickles arguments and results with its own vendored copy of
cloudpickle, whose tracker is separate from the one core uses to ship
worker classes (and that channels and p2p use): a class shipped by core was
unknown to Ray's copy, so results came back as instances of a look-alike
class.  ``share_class_tracker`` makes both copies use one tracker, in every
process that imports this package (the driver and each worker actor), and
makes Ray's copy, like core's, leave a process's own classes unchanged when
they come back (``serialization.keep_own_classes``), and ship the
program's own modules (a test module, say) by value as core's copy does
(``serialization.ship_run_time_modules_by_value``).
"""

from __future__ import annotations

_TABLES = ("_DYNAMIC_CLASS_TRACKER_BY_CLASS", "_DYNAMIC_CLASS_TRACKER_BY_ID", "_DYNAMIC_CLASS_TRACKER_LOCK")


def share_class_tracker() -> bool:
    """Point Ray's cloudpickle at core's class tracker; True when both now share one.

    Classes Ray's copy already tracked are carried over.  If either copy lacks
    the tracker (another cloudpickle version) nothing changes: classes then
    arrive as look-alikes, as before.
    """
    import cloudpickle.cloudpickle as ours

    try:
        import ray.cloudpickle.cloudpickle as rays
    except ImportError:
        return False
    if not all(hasattr(m, name) for m in (ours, rays) for name in _TABLES):
        return False
    from rlinf.scheduler.base.serialization import also_ship_by_value_with, keep_own_classes

    keep_own_classes(rays)
    also_ship_by_value_with(rays)  # Ray pickles call arguments with its copy
    if rays._DYNAMIC_CLASS_TRACKER_BY_ID is ours._DYNAMIC_CLASS_TRACKER_BY_ID:
        return True
    with ours._DYNAMIC_CLASS_TRACKER_LOCK, rays._DYNAMIC_CLASS_TRACKER_LOCK:
        for cls, tracker_id in list(rays._DYNAMIC_CLASS_TRACKER_BY_CLASS.items()):
            ours._DYNAMIC_CLASS_TRACKER_BY_CLASS.setdefault(cls, tracker_id)
            ours._DYNAMIC_CLASS_TRACKER_BY_ID.setdefault(tracker_id, cls)
        for name in _TABLES:
            setattr(rays, name, getattr(ours, name))
    return True
