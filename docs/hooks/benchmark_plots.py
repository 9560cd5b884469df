"""mkdocs hook: the benchmark plots on ``benchmarks.md``.

The benchmarks write their plots to ``benchmarks/results/`` (or
``RLINF_BENCH_RESULTS``), which is not committed: plots depend on the machine
that ran them.  This hook adds whatever PNGs are there to the site under
``benchmark-plots/`` and replaces the ``<!-- benchmark plots -->`` marker of
``benchmarks.md`` with one section per benchmark listed in
``benchmarks/run.py``: its plot when it has been run on the machine building
the site, else the reference plot committed in ``docs/reference-plots/``
(made on the project's test machine, and said so), else the command that
makes it.  So the page never links a missing image, the strict build passes
on a fresh clone, and a site built by CI still shows every plot.
"""

from __future__ import annotations

import ast
import os

MARKER = "<!-- benchmark plots -->"
PAGE = "benchmarks.md"
PLOTS_URI = "benchmark-plots"
REFERENCE_URI = "reference-plots"  # a folder of docs/: mkdocs copies it as it is


def _root(config) -> str:
    """The repository root: the folder of ``mkdocs.yml``."""
    return os.path.dirname(os.path.abspath(config.config_file_path))


def _pngs(folder: str) -> dict:
    if not os.path.isdir(folder):
        return {}
    return {f[:-4]: os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".png")}


def plots(root: str) -> dict:
    """name -> path of each PNG in the benchmarks' results folder."""
    return _pngs(os.environ.get("RLINF_BENCH_RESULTS") or os.path.join(root, "benchmarks", "results"))


def reference_plots(root: str) -> dict:
    """name -> path of each committed reference plot (``docs/reference-plots/``)."""
    return _pngs(os.path.join(root, "docs", REFERENCE_URI))


def _literal(path: str, name: str):
    """The value of the module-level assignment ``name = <literal>`` in ``path``, read without importing it."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def _summary(path: str) -> str:
    """The first paragraph of a benchmark module's docstring, on one line."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read(), path)) or ""
    except OSError:
        return ""
    return " ".join(doc.split("\n\n")[0].split())


def benchmarks(root: str) -> dict:
    """name -> module file of every benchmark ``benchmarks/run.py`` knows."""
    bench = os.path.join(root, "benchmarks")
    names = _literal(os.path.join(bench, "run.py"), "BENCHMARKS") or {}
    return {name: os.path.join(bench, module.replace(".", os.sep) + ".py") for name, module in names.items()}


REFERENCE_CAPTION = ("*Reference plot, measured on the project's 2-core test machine (a virtual machine); "
                     "`hatch run bench {name}` makes this machine's, shown here by the next `hatch run docs`.*\n")


def render(known: dict, images: dict, reference: dict = None) -> str:
    """The markdown that replaces the marker.

    ``known``: benchmark name -> module file (``benchmarks()``); ``images``:
    plot name -> PNG path (``plots()``); ``reference``: the same for the
    committed reference plots (``reference_plots()``).  One section per known
    benchmark, with its plot (this machine's, else the reference one) or the
    command that makes it, then any other plot found.
    """
    reference = reference or {}
    out = []
    if not images and not reference:
        out.append(
            '!!! note "No plots in this build"\n'
            "    The plots are made on the machine that builds the site: run a benchmark\n"
            "    (`hatch run bench group`, for instance), then `hatch run docs` again.\n"
        )
    for name, module in known.items():
        out.append(f"## `{name}`\n")
        summary = _summary(module)
        if summary:
            out.append(summary + "\n")
        out.append(_plot(name, images, reference)
                   or f"No plot yet: `hatch run bench {name}` writes `benchmarks/results/{name}.png`.\n")
    for name in sorted((set(images) | set(reference)) - set(known)):
        out.append(f"## `{name}`\n\n" + _plot(name, images, reference))
    return "\n".join(out)


def _plot(name: str, images: dict, reference: dict) -> str:
    """The markdown of plot ``name``: this machine's, else the reference one (captioned), else ''."""
    if name in images:
        return f"![{name} benchmark plot]({PLOTS_URI}/{name}.png)\n"
    if name in reference:
        return f"![{name} benchmark plot]({REFERENCE_URI}/{name}.png)\n\n" + REFERENCE_CAPTION.format(name=name)
    return ""


def on_files(files, config):
    from mkdocs.structure.files import File  # imported here so that render() is usable without mkdocs

    for name, path in plots(_root(config)).items():
        files.append(File.generated(config, f"{PLOTS_URI}/{name}.png", abs_src_path=path))
    return files


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"{PAGE} lost its {MARKER!r} marker: the benchmark plots have nowhere to go")
    root = _root(config)
    return markdown.replace(MARKER, render(benchmarks(root), plots(root), reference_plots(root)))
