"""Plugin discovery, listing, selection and failure isolation, read from real entry points.

Each case runs in a fresh interpreter whose ``sys.path`` holds the installed
packages plus, where needed, a directory with extra ``*.dist-info``
distributions: exactly what ``importlib.metadata`` reads after a pip install.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from user_env import user_env

pytestmark = pytest.mark.timeout(120)


def make_dist(root, dist, version, entry_points: dict, modules: dict):
    """Write an installed-looking distribution (dist-info + modules) under ``root``."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    lines = ["[rlinf]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    for name, source in modules.items():
        (root / f"{name}.py").write_text(textwrap.dedent(source))


def run(code, extra_path=None, **env):
    full_env = user_env()  # a user's shell: none of hatch.toml's env-vars
    full_env.pop("RLINF_PLUGINS", None)
    full_env.update(env)
    if extra_path:
        full_env["PYTHONPATH"] = os.pathsep.join([str(extra_path), full_env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=90)


LIST = "import sys; from rlinf.scheduler.__main__ import main; sys.exit(main(['plugins']))"

GOOD_LAUNCHER = """
    from rlinf.scheduler.plugins import LauncherPlugin, hookimpl

    @hookimpl
    def rlinf_register_launchers():
        return [LauncherPlugin(name="toy", factory=lambda: None, priority=1, check=lambda: None)]
"""


def test_listing_shows_builtin_and_ray():
    out = run(LIST)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[1:] if line.strip()}
    assert rows["ray"][1:4] == ["launcher", "rlinf-ray", "0.1.0"] and "yes" in rows["ray"]
    assert rows["cpu"][1] == "transport" and rows["cpu"][3] == "rlinf-core"


def test_module_cli_entry():
    out = subprocess.run([sys.executable, "-m", "rlinf.scheduler", "plugins"], capture_output=True, text=True, timeout=60,
                         env=user_env())
    assert out.returncode == 0 and "ray" in out.stdout


def test_broken_plugin_is_reported_and_the_rest_keep_working(tmp_path):
    make_dist(tmp_path, "broken-plugin", "9.9", {"broken": "broken_mod"}, {"broken_mod": "raise ImportError('needs libfoo')"})
    out = run(LIST, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "broken" in out.stdout and "broken-plugin" in out.stdout and "needs libfoo" in out.stdout
    check = run("""
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            from rlinf.scheduler.plugins import get_registry
            reg = get_registry()
        assert reg.launcher().name == "ray"
        assert reg.transport().name == "cpu"
        msgs = [str(x.message) for x in w]
        assert any("'broken'" in m and "broken-plugin" in m and "needs libfoo" in m for m in msgs), msgs
        print("ok")
    """, tmp_path)
    assert check.stdout.strip() == "ok", check.stderr


def test_plugin_not_meeting_the_specs(tmp_path):
    make_dist(tmp_path, "badspec", "1.0", {"badspec": "badspec_mod", "nohooks": "nohooks_mod"}, {
        "badspec_mod": """
            from rlinf.scheduler.plugins import hookimpl

            @hookimpl
            def rlinf_register_launchers(unexpected_argument):
                return []

            @hookimpl
            def rlinf_unknown_hook():
                return []
        """,
        "nohooks_mod": "X = 1\n",
    })
    out = run(LIST, tmp_path)
    assert out.returncode == 0, out.stderr
    lines = {line.split()[0]: line for line in out.stdout.splitlines()[1:] if line.strip()}
    assert "hook specs" in lines["badspec"] and "implements no rlinf hook" in lines["nohooks"]
    assert "yes" in lines["ray"]


def test_name_conflict_names_both_distributions(tmp_path):
    make_dist(tmp_path, "toy-one", "1.0", {"toy1": "toy_one"}, {"toy_one": GOOD_LAUNCHER})
    make_dist(tmp_path, "toy-two", "2.0", {"toy2": "toy_two"}, {"toy_two": GOOD_LAUNCHER})
    out = run("""
        from rlinf.scheduler.plugins import get_registry
        from rlinf.scheduler.base.errors import PluginError
        try:
            get_registry().launcher("toy")
        except PluginError as e:
            print(e)
    """, tmp_path)
    assert "toy-one" in out.stdout and "toy-two" in out.stdout and "more than one" in out.stdout, out.stderr


def test_selection_by_env_and_unknown_names(tmp_path):
    make_dist(tmp_path, "toy-one", "1.0", {"toy1": "toy_one"}, {"toy_one": GOOD_LAUNCHER})
    out = run("from rlinf.scheduler.plugins import get_registry; print(get_registry().launcher().name)", tmp_path,
              RLINF_LAUNCHER="toy")
    assert out.stdout.strip() == "toy", out.stderr
    out = run("from rlinf.scheduler.plugins import get_registry; print(get_registry().launcher().name)", tmp_path)
    assert out.stdout.strip() == "ray"  # highest priority wins without a choice
    out = run("from rlinf.scheduler import Cluster; Cluster()", RLINF_LAUNCHER="nosuch")
    assert out.returncode != 0 and "no launcher named 'nosuch'" in out.stderr and "ray" in out.stderr


def test_autoload_switch(tmp_path):
    out = run(LIST, RLINF_PLUGINS_AUTOLOAD="0")
    names = [line.split()[0] for line in out.stdout.splitlines()[1:] if line.strip() and not line.startswith("(")]
    assert "cpu" in names and "ray" not in names and "autoloading is off" in out.stdout
    out = run(LIST, RLINF_PLUGINS_AUTOLOAD="0", RLINF_PLUGINS="rlinf.ray.plugin")
    assert any(line.startswith("ray ") for line in out.stdout.splitlines())
