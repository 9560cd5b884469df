"""Each package builds a wheel with hatchling, and rlinf stays a namespace package."""

import glob
import importlib.util
import os
import subprocess
import sys
import zipfile

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")


@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("hatchling") is None, reason="hatchling is not installed in this environment")
def test_every_package_builds_a_wheel(tmp_path):
    packages = sorted(glob.glob(os.path.join(ROOT, "packages", "*")))
    assert [os.path.basename(p) for p in packages] == ["rlinf-core", "rlinf-mpi", "rlinf-nccl", "rlinf-ray"]
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                          "-w", str(tmp_path), *packages], capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    wheels = sorted(os.path.basename(w) for w in glob.glob(str(tmp_path / "*.whl")))
    assert [w.split("-")[0] for w in wheels] == ["rlinf_core", "rlinf_mpi", "rlinf_nccl", "rlinf_ray"]
    for wheel in glob.glob(str(tmp_path / "*.whl")):
        names = zipfile.ZipFile(wheel).namelist()
        assert "rlinf/__init__.py" not in names  # PEP 420: no package owns the namespace
    core = zipfile.ZipFile(glob.glob(str(tmp_path / "rlinf_core-*.whl"))[0]).namelist()
    assert "rlinf/scheduler/plugins/hookspecs.py" in core and "rlinf/testing/transport.py" in core
