"""The README's first command: every example runs to completion."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest


@pytest.mark.timeout(600)
def test_examples_run():
    temp_dir = tempfile.mkdtemp(prefix="rlex")  # short: Ray's socket paths must fit in 107 bytes
    env = dict(os.environ, RLINF_RAY_TEMP_DIR=temp_dir)
    runner = os.path.join(os.path.dirname(__file__), "..", "examples", "run_all.py")
    try:
        out = subprocess.run([sys.executable, runner], capture_output=True, text=True, timeout=580, env=env)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "3 passed, 0 failed" in out.stdout
