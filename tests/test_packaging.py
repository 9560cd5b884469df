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


def _readme_install_command() -> list:
    """The packages of the README's install command (``pip install ./packages/...``), as written there."""
    readme = open(os.path.join(ROOT, "README.md")).read()
    line = next(ln for ln in readme.splitlines() if ln.startswith("pip install ./packages/"))
    return line.split("#")[0].split()[2:]


@pytest.mark.timeout(300)
@pytest.mark.skipif(importlib.util.find_spec("hatchling") is None, reason="hatchling is not installed in this environment")
def test_the_readmes_install_command_gives_a_working_rlinf(tmp_path):
    """What the README tells a user to install, installed as pip installs it (from the paths it names) into a
    directory of its own, is all a program needs: rlinf from there alone (none of the development
    environment's editable sources), the Ray launcher usable, in a user's environment.  Offline and cheap:
    the dependencies (Ray, numpy, ...) are the development environment's, reached through a directory that
    holds everything of its site-packages but rlinf's."""
    import sysconfig

    from user_env import user_env

    packages = _readme_install_command()
    assert packages == ["./packages/rlinf-core", "./packages/rlinf-ray"], packages
    target = tmp_path / "installed"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--target", str(target), *packages], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    deps = tmp_path / "deps"
    deps.mkdir()
    site = sysconfig.get_paths()["purelib"]
    for name in os.listdir(site):
        if not name.lower().startswith(("rlinf", "_editable_impl_rlinf", "__editable__")) and not name.endswith(".pth"):
            os.symlink(os.path.join(site, name), deps / name)
    env = user_env(PYTHONPATH=os.pathsep.join([str(target), str(deps)]))
    code = ("import rlinf.scheduler, rlinf.ray, sys; print(rlinf.scheduler.__file__); print(rlinf.ray.__file__); "
            "from rlinf.scheduler.__main__ import main; sys.exit(main(['plugins']))")
    # -S: no site-packages (and so none of its .pth files, which put the editable sources on the path)
    run = subprocess.run([sys.executable, "-S", "-c", code], cwd=str(tmp_path), capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[0].startswith(str(target)) and lines[1].startswith(str(target)), lines[:2]
    rows = {line.split()[0]: line.split() for line in lines[3:] if line.strip()}
    assert rows["ray"][1] == "launcher" and "yes" in rows["ray"], run.stdout
    assert rows["cpu"][1] == "transport" and "yes" in rows["cpu"], run.stdout
    assert "broken" not in run.stdout, run.stdout
