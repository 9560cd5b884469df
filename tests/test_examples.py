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
    assert "4 passed, 0 failed" in out.stdout
    # the quick start prints what the README says it prints
    assert "['sent', {'lr': 0.1, 'from': 0}]" in out.stdout and "[(1, 0), (1, 1), (1, 2)]" in out.stdout


def test_the_readme_quick_start_is_the_example_that_runs():
    """A program written from the README alone is the one the demo runs, word for word."""
    here = os.path.dirname(os.path.abspath(__file__))
    readme = open(os.path.join(here, "..", "README.md")).read()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    example = open(os.path.join(here, "..", "examples", "quickstart.py")).read().split('"""', 2)[2].lstrip("\n")
    assert block == example, "README's first python block and examples/quickstart.py differ"
