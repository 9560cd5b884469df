"""benchmarks/gpu/check.sh on a machine without a GPU: exits 0 and says why each part was skipped."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _gpu_here() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


@pytest.mark.skipif(_gpu_here(), reason="a GPU is visible: run benchmarks/gpu/check.sh itself (it takes minutes)")
def test_check_script_skips_cleanly_without_a_gpu():
    env = dict(os.environ, PYTHON=sys.executable)
    out = subprocess.run(["bash", os.path.join(ROOT, "benchmarks", "gpu", "check.sh")], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    for part in ("gpu conformance tests", "bandwidth table", "seed GPU examples"):
        assert any(line.startswith(f"SKIP {part}: ") and "CUDA" in line for line in lines), out.stdout


@pytest.mark.skipif(_gpu_here(), reason="a GPU is visible: the table would run for real")
def test_bandwidth_script_skips_cleanly_without_a_gpu():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu", "bandwidth.py")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.startswith("SKIP bandwidth table: no CUDA device"), out.stdout + out.stderr
