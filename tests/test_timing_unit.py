import time

import pytest

from rlinf.scheduler.base import timing


def test_capture_and_nesting():
    with timing.capture_durations() as log:
        with timing.worker_timer("outer"):
            with timing.worker_timer("inner"):
                time.sleep(0.01)
    assert set(log) == {"outer", "inner"}
    assert log["outer"] >= log["inner"] >= 0.01


def test_orphans_go_to_next_call():
    with timing.worker_timer("before"):
        pass
    with timing.capture_durations() as log:
        pass
    assert "before" in log
    with timing.capture_durations() as log2:
        pass
    assert log2 == {}


def test_reduce():
    per_rank = [{"a": 1.0, "b": 2.0}, {"a": 3.0}]
    assert timing.reduce_durations(per_rank) == {"a": 3.0, "b": 2.0}
    assert timing.reduce_durations(per_rank, "min") == {"a": 1.0, "b": 2.0}
    assert timing.reduce_durations(per_rank, "mean") == {"a": 2.0, "b": 2.0}
    with pytest.raises(ValueError):
        timing.reduce_durations(per_rank, "sum")
