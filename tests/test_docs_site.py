"""The documentation site's sources: every setting is documented, and the build hooks do what the pages rely on.

The site itself is built by ``.ci/run`` (``hatch run docs``: ``mkdocs build
--strict`` in the docs environment, where any warning fails).  These checks
need no mkdocs, so they run with the rest of the suite.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOOKS = ROOT / "docs" / "hooks"

# a variable name, not part of a longer identifier (``_RLINF_TYPES`` is a Python name)
VARIABLE = re.compile(r"(?<![A-Za-z0-9_])RLINF_[A-Z0-9_]*[A-Z0-9]")


def _hook(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_hook_{name}", HOOKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _site_text() -> str:
    """README.md (the home page) and every page under docs/."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return "\n".join(p.read_text(encoding="utf-8") for p in pages)


def test_every_rlinf_variable_the_code_reads_is_documented():
    used = {}
    for path in sorted(ROOT.glob("packages/*/src/**/*.py")):
        for name in VARIABLE.findall(path.read_text(encoding="utf-8")):
            used.setdefault(name, path.relative_to(ROOT))
    assert "RLINF_TIMEOUT" in used  # the scan sees the sources
    documented = set(VARIABLE.findall(_site_text()))
    missing = {name: str(path) for name, path in used.items() if name not in documented}
    assert not missing, (
        f"environment variables read by the code but named on no page of the site: {missing}; "
        "add them to docs/reference/config.md (or the backend's page under docs/backends/)"
    )


def test_benchmark_page_links_only_plots_that_exist(tmp_path):
    hook = _hook("benchmark_plots")
    known = hook.benchmarks(str(ROOT))
    assert "group" in known and "p2p" in known  # read from benchmarks/run.py without importing it
    assert all(Path(module).is_file() for module in known.values()), known

    page = hook.render(known, {})
    assert "![" not in page  # no image without a file: the strict build would fail
    assert "No plots in this build" in page
    for name in known:
        assert f"hatch run bench {name}" in page
    assert "Group call overhead" in page  # each section opens with its benchmark's docstring

    png = tmp_path / "group.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n")
    extra = tmp_path / "bandwidth.png"
    extra.write_bytes(b"\x89PNG\r\n\x1a\n")
    images = {"group": str(png), "bandwidth": str(extra)}
    page = hook.render(known, images)
    assert f"]({hook.PLOTS_URI}/group.png)" in page
    assert "No plots in this build" not in page
    assert "hatch run bench group" not in page and "hatch run bench p2p" in page
    assert f"]({hook.PLOTS_URI}/bandwidth.png)" in page  # a plot no benchmark of run.py names is still shown

    # a site built where no benchmark ran (CI) shows the committed reference plots, captioned as such
    reference = hook.reference_plots(str(ROOT))
    assert set(known) <= set(reference), f"no reference plot for {sorted(set(known) - set(reference))}"
    page = hook.render(known, {"group": str(png)}, reference)
    assert f"]({hook.PLOTS_URI}/group.png)" in page and f"]({hook.REFERENCE_URI}/group.png)" not in page
    assert f"]({hook.REFERENCE_URI}/p2p.png)" in page and "Reference plot" in page
    assert "No plot yet" not in page and "No plots in this build" not in page


def test_benchmark_plots_are_found_in_the_results_folder(tmp_path, monkeypatch):
    hook = _hook("benchmark_plots")
    (tmp_path / "p2p.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (tmp_path / "notes.txt").write_text("not a plot")
    monkeypatch.setenv("RLINF_BENCH_RESULTS", str(tmp_path))
    assert hook.plots(str(ROOT)) == {"p2p": str(tmp_path / "p2p.png")}
    monkeypatch.setenv("RLINF_BENCH_RESULTS", str(tmp_path / "absent"))
    assert hook.plots(str(ROOT)) == {}


def test_optional_guides_join_the_nav_only_once_they_exist(tmp_path):
    hook = _hook("optional_pages")
    nav = [
        {"Home": "index.md"},
        {"Guides": [{"Architecture": "architecture.md"}, {"Tracing": "tracing.md"}, "observability.md"]},
    ]
    assert hook._prune(nav, str(tmp_path)) == [{"Home": "index.md"}, {"Guides": [{"Architecture": "architecture.md"}]}]
    (tmp_path / "tracing.md").write_text("# Tracing\n")
    (tmp_path / "observability.md").write_text("# Observability\n")
    assert hook._prune(nav, str(tmp_path)) == nav
    # only the optional pages are pruned: any other missing page is left for mkdocs to report
    assert hook._prune([{"Gone": "gone.md"}], str(tmp_path)) == [{"Gone": "gone.md"}]


def test_rst_literal_markers_render_as_one_colon():
    fix = _hook("literal_blocks").fix
    code = '\n<div class="language-toml highlight"><pre><code>x = 1</code></pre></div>'
    assert fix("<p>in this group::</p>" + code) == "<p>in this group:</p>" + code
    assert fix("<p>::</p>" + code) == code
    prose = "<p>a C++ name like <code>std::vector</code> ends here::</p><p>no code follows</p>"
    assert fix(prose) == prose  # only a colon pair that introduces a code block changes


def test_guide_names_link_to_their_pages():
    link = _hook("page_links").link
    urls = {"security.md": "../security/"}
    html = "<p>see <code>docs/security.md</code> and <code>docs/tracing.md</code></p>"
    assert link(html, urls.get) == (
        '<p>see <a href="../security/"><code>docs/security.md</code></a> and <code>docs/tracing.md</code></p>'
    )
    block = "<pre><code>cat docs/security.md\n</code></pre>"
    assert link(block, urls.get) == block  # code blocks are left alone


# ``::: module`` and the ``members:`` option under it, in a page of the site
DIRECTIVE = re.compile(r"^::: (\S+)\n((?:[ \t]+\S.*\n?)*)", re.M)
MEMBERS = re.compile(r"^\s+members:\s*(.+)$", re.M)


def _rendered() -> dict:
    """module -> the member names its directives render (None: every public member)."""
    shown: dict = {}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for module, options in DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            members = MEMBERS.search(options)
            if members is None:
                shown[module] = None
            elif module not in shown or shown[module] is not None:
                value = members.group(1).strip()
                names = set() if value == "false" else {n.strip() for n in value.strip("[]").split(",")}
                shown[module] = (shown.get(module) or set()) | names
    return shown


def test_every_public_name_has_an_api_reference_entry():
    import importlib

    import rlinf.scheduler
    import rlinf.scheduler.plugins
    import rlinf.testing

    shown = _rendered()
    assert "rlinf.scheduler.runtime.cluster" in shown  # the pages were read
    missing = []
    for package in (rlinf.scheduler, rlinf.scheduler.plugins, rlinf.testing):
        for name in package.__all__:
            obj = getattr(package, name)
            # rendered where it is defined, or through the module that exports it (griffe follows the alias)
            covered = any(
                getattr(importlib.import_module(module), name, None) is obj and (members is None or name in members)
                for module, members in shown.items()
                if module == package.__name__ or module.startswith(package.__name__ + ".")
            )
            if not covered:
                missing.append(f"{package.__name__}.{name}")
    assert not missing, f"public names without an API reference entry: {missing}; add them to a page under docs/reference/"


def test_contributors_notes_stay_out_of_the_api_reference():
    """``Layer: ...`` paragraphs of package docstrings (for contributors) are taken out of the rendered pages;
    the paragraphs around them stay."""
    notes = _hook("contributor_notes")
    html = ("<p>Workers and groups.</p>\n<p>Layer: the public API.  It may import\n<code>runtime</code> "
            "and every layer below.</p>\n<p>Next.</p>")
    assert notes.strip_notes(html) == "<p>Workers and groups.</p>\n<p>Next.</p>"
    # the notes are there to take out: a package the reference renders has one
    assert "Layer: the public API" in (ROOT / "packages/rlinf-core/src/rlinf/scheduler/worker/__init__.py").read_text()
    assert "docs/hooks/contributor_notes.py" in (ROOT / "mkdocs.yml").read_text()


def test_no_script_of_docs_is_copied_into_the_site():
    """mkdocs copies every file of docs/ it does not take for a page: the scripts there are excluded."""
    config = (ROOT / "mkdocs.yml").read_text()
    excluded = config.split("exclude_docs: |", 1)[1].split("\n\n", 1)[0]
    assert "/*.py" in excluded.split() and "__pycache__/" in excluded.split(), excluded  # and their bytecode
    assert sorted(p.name for p in (ROOT / "docs").glob("*.py")) == ["check_pages.py", "layers.py"]


def test_no_line_of_a_page_turns_into_a_block_quote_by_accident():
    """A line that begins with ``>`` is a block quote in Markdown: a comparison such as ``>= 1x`` that
    wraps to the start of a line renders as one.  Intended quotes begin with ``> `` and a word."""
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        fenced = False
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            if not fenced and re.match(r">\s*[=<>\d.]", line):
                raise AssertionError(f"{path.relative_to(ROOT)}:{number} renders as a block quote: {line}")
