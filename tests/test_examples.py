"""The README's first command: every example runs to completion.

``hatch run demo`` (examples/run_all.py) runs the examples one after the
other; here each one runs exactly as a user runs it (``python examples/X.py``,
starting its own embedded Ray in a temp dir of its own), all at once: they
share nothing, and on a small machine most of each one's time is waiting for
its Ray to start, so running them together takes about half as long.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from user_env import user_env

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


def _demo_examples() -> list:
    """The examples ``examples/run_all.py`` (the demo) runs, in its order."""
    spec = importlib.util.spec_from_file_location("run_all", os.path.join(EXAMPLES_DIR, "run_all.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines EXAMPLES and main(); runs nothing
    return list(module.EXAMPLES)


@pytest.mark.timeout(600)
def test_examples_run():
    examples = _demo_examples()
    # the demo runs every example there is (the plugin example is a package, tested on its own)
    assert sorted(examples) == sorted(f for f in os.listdir(EXAMPLES_DIR) if f.endswith(".py") and f != "run_all.py")
    env = user_env()  # a user's shell: none of hatch.toml's env-vars (run_all.py adds none either)
    runs = {}
    try:
        # the slowest (communication.py: two groups of four) first, so it overlaps the most
        for name in sorted(examples, key=lambda n: n != "communication.py"):
            temp_dir = tempfile.mkdtemp(prefix="rlex")  # short: Ray's socket paths must fit in 107 bytes
            proc = subprocess.Popen([sys.executable, os.path.join(EXAMPLES_DIR, name)], env=dict(env, RLINF_RAY_TEMP_DIR=temp_dir),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
            runs[name] = (proc, temp_dir)
        outputs = {}
        deadline = time.monotonic() + 540
        for name, (proc, _) in runs.items():
            try:
                outputs[name] = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))[0]
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                outputs[name] = proc.communicate(timeout=30)[0] + "\n[killed: the examples ran past 540 s]"
    finally:
        for proc, temp_dir in runs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(30)
            shutil.rmtree(temp_dir, ignore_errors=True)
    failed = {name: outputs[name][-3000:] for name, (proc, _) in runs.items() if proc.returncode != 0}
    assert not failed, failed
    # the quick start prints what the README says it prints
    out = outputs["quickstart.py"]
    assert "['sent', {'lr': 0.1, 'from': 0}]" in out and "[(1, 0), (1, 1), (1, 2)]" in out, out[-3000:]


def test_the_readme_quick_start_is_the_example_that_runs():
    """A program written from the README alone is the one the demo runs, word for word."""
    here = os.path.dirname(os.path.abspath(__file__))
    readme = open(os.path.join(here, "..", "README.md")).read()
    block = readme.split("```python\n", 1)[1].split("```", 1)[0]
    example = open(os.path.join(here, "..", "examples", "quickstart.py")).read().split('"""', 2)[2].lstrip("\n")
    assert block == example, "README's first python block and examples/quickstart.py differ"
