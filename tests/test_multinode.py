"""Placement across nodes, on a Ray cluster of two simulated nodes (one machine)."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest


@pytest.mark.timeout(240)
def test_node_placement_across_two_nodes():
    program = os.path.join(os.path.dirname(__file__), "multinode_program.py")
    temp_dir = tempfile.mkdtemp(prefix="rlmn")  # short: Ray's socket paths must fit in 107 bytes
    try:
        env = dict(os.environ, RAY_TMPDIR=temp_dir)
        out = subprocess.run([sys.executable, program, temp_dir], capture_output=True, text=True, timeout=220, env=env)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert "MULTINODE OK" in out.stdout, out.stdout[-3000:] + out.stderr[-5000:]
