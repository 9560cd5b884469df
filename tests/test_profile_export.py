"""A profiler window is written without following a link planted at its path (real ``torch.profiler``)."""

import json
import os
import stat

import torch

from rlinf.scheduler.worker.worker_utilities import export_profile


def _window():
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    profiler.start()
    torch.ones(8).sum()
    profiler.stop()
    return profiler


def test_a_link_planted_at_the_profile_path_is_replaced_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    out = tmp_path / "profiles"
    out.mkdir()
    path = out / "rlinf_profile_actor_0_123_step1.json"
    os.symlink(victim, path)  # what a neighbour with write access to the folder could leave there
    assert export_profile(_window(), str(path)) == str(path)
    assert victim.read_text() == "keep me"
    mode = os.lstat(path).st_mode
    assert stat.S_ISREG(mode) and stat.S_IMODE(mode) == 0o600, oct(mode)
    assert "traceEvents" in json.loads(path.read_text())
    assert sorted(p.name for p in out.iterdir()) == [path.name]  # no temporary file left behind


def test_a_failed_export_leaves_nothing_behind(tmp_path):
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])  # never started
    try:
        export_profile(profiler, str(tmp_path / "p.json"))
    except Exception:
        pass
    assert list(tmp_path.iterdir()) == []
