"""A third-party transport package, pip-installed into this environment, selected
by name, listed, and checked with the conformance suite, each in a fresh process."""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

PLUGIN_DIR = os.path.join(os.path.dirname(__file__), "..", "examples", "plugins", "rlinf-plaintcp")
pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def installed():
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", PLUGIN_DIR]
    if importlib.util.find_spec("hatchling") is not None:
        cmd.insert(-1, "--no-build-isolation")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    yield
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "rlinf-plaintcp"], capture_output=True, timeout=120)


def test_listed_with_distribution_and_version(installed):
    out = subprocess.run([sys.executable, "-m", "rlinf.scheduler", "plugins"], capture_output=True, text=True, timeout=60)
    row = next(line for line in out.stdout.splitlines() if line.startswith("plaintcp"))
    assert "rlinf-plaintcp" in row and "0.1.0" in row and "yes" in row.split()


def test_conformance_suite_passes(installed, tmp_path):
    (tmp_path / "test_plaintcp_conformance.py").write_text(textwrap.dedent("""
        from rlinf.testing import TransportConformance

        class TestPlainTcp(TransportConformance):
            transport_name = "plaintcp"
    """))
    report = tmp_path / "report.xml"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
                          str(tmp_path)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    # counted: every test of the kit ran and passed, none skipped ("1 passed, 9 skipped" is not a pass)
    from conformance_counts import assert_class_ran_whole_kit, junit_outcomes, kit_tests
    from rlinf.testing import TransportConformance

    outcomes = junit_outcomes(report)
    assert_class_ran_whole_kit(outcomes, "TestPlainTcp", kit_tests(TransportConformance))
    assert len(outcomes) == len(kit_tests(TransportConformance)), outcomes


def test_selected_by_name_and_env_between_workers(installed):
    temp_dir = tempfile.mkdtemp(prefix="rltp")
    try:
        program = os.path.join(os.path.dirname(__file__), "third_party_program.py")
        out = subprocess.run([sys.executable, program, temp_dir], capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert "THIRD PARTY OK" in out.stdout, out.stdout[-3000:] + out.stderr[-5000:]
