"""The benchmarks' plots: one look for all, drawn from data saved beside each plot.

Every benchmark describes its plot as a *spec*, a dict that JSON can hold::

    {"title": "rlinf vs raw Ray, 4 workers",
     "source": "...",                         # optional: where the numbers come from, if not a run
     "panels": [{"kind": "bar",               # or "line"
                 "title": "launch + first answer",
                 "ylabel": "time (s)",        # one quantity, its unit in parentheses
                 "xlabel": "",                # optional
                 "x": ["4 workers"],          # bar categories, or the x values of a line plot
                 "series": {"raw Ray": [0.69], "rlinf": [0.71]},
                 "log": False,                # optional: logarithmic y axis
                 "styles": {"raw Ray": "o--"}}]}   # optional, line plots: matplotlib format strings

``save(name, spec)`` writes ``RESULTS/name.json`` (the spec) and
``RESULTS/name.png`` (the drawing).  So a change of style never needs a
benchmark to run again: ``python benchmarks/plots.py FOLDER...`` redraws every
``NAME.json`` of the folders into ``NAME.png`` (the committed reference plots of
the docs, ``docs/reference-plots/``, are redrawn this way).

The look holds what a reader of the docs needs, who sees a plot about 750 px
wide: figures 8 in wide, 11 pt text, each panel one unit on its y axis (said
in its label), and legends outside the data (below the figure when every
panel has the same series, else below each panel).  A line panel whose values
span more than ``LOG_SPAN`` times is drawn on a logarithmic axis whatever its
``log`` says (one point far off the rest would squeeze them against the
axis), and each of its series gets a marker of its own, so lines that run
together stay told apart.  A bar value may be ``None`` (JSON ``null``): that
series has no bar in that category (a baseline that belongs to one category
only).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys

#: the figure's width in inches; the docs show it about 750 px wide, so 1 pt of text is about 1.3 px there
WIDTH_IN = 8.0
#: pixels per inch of the PNG (960 px wide: sharp, yet small files)
DPI = 120
#: the base font size in points; nothing is drawn smaller than ``MIN_FONT_PT``
FONT_PT = 11
MIN_FONT_PT = 10
#: a line panel whose largest value is more than this many times its smallest is drawn on a log axis
LOG_SPAN = 20.0
#: the markers of a line panel's series, in order (a series with a style of its own keeps it)
MARKERS = "osD^vPX*<>"
#: a y label names its unit in parentheses at its end: "time (s)", "bandwidth (GB/s)"
UNIT_RE = re.compile(r"\([^()]+\)\s*$")
STYLE = {
    "font.size": FONT_PT,
    "axes.titlesize": FONT_PT + 1,
    "axes.labelsize": FONT_PT,
    "xtick.labelsize": FONT_PT,
    "ytick.labelsize": FONT_PT,
    "legend.fontsize": FONT_PT,
    "figure.titlesize": FONT_PT + 2,
    "axes.grid": True,
    "axes.axisbelow": True,
    "grid.alpha": 0.35,
}


def _jsonable(values) -> list:
    return [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in values]


def bar(x: list, series: dict, ylabel: str, title: str = "", log: bool = False, xlabel: str = "") -> dict:
    """A panel of bars: at each category of ``x``, one bar per series.

    Args:
        x: the categories (their labels; ``\\n`` breaks a long one).
        series: legend label -> one value per category, all in the unit of ``ylabel``; ``None`` where the
            series has no bar in that category.
        ylabel: the quantity and its unit in parentheses, e.g. ``"time (ms)"``.
        title: the panel's title (shown when the figure has several panels).
        log: a logarithmic y axis.
        xlabel: the x axis's label.

    Raises:
        Nothing; ``check_spec`` judges the panel when it is drawn.
    """
    return {"kind": "bar", "title": title, "ylabel": ylabel, "xlabel": xlabel, "x": [str(v) for v in x],
            "series": {k: _jsonable(v) for k, v in series.items()}, "log": log}


def line(x: list, series: dict, ylabel: str, xlabel: str, title: str = "", log: bool = False,
         styles: dict | None = None) -> dict:
    """A panel of lines: each series's values over the numbers ``x``.

    Args:
        x: the x values (numbers, ticked each).
        series: legend label -> one value per x, all in the unit of ``ylabel``.
        ylabel: the quantity and its unit in parentheses, e.g. ``"time (s)"``.
        xlabel: the x axis's label.
        title: the panel's title (shown when the figure has several panels).
        log: a logarithmic y axis (else it starts at 0, unless the values span more than ``LOG_SPAN``).
        styles: legend label -> matplotlib format string (``"o--"``); by default a solid line with
            a marker of the series's own (``MARKERS``).

    Raises:
        Nothing; ``check_spec`` judges the panel when it is drawn.
    """
    return {"kind": "line", "title": title, "ylabel": ylabel, "xlabel": xlabel, "x": _jsonable(x),
            "series": {k: _jsonable(v) for k, v in series.items()}, "log": log, "styles": dict(styles or {})}


def check_spec(spec: dict) -> None:
    """Raise ``ValueError`` when ``spec`` breaks a rule of the plots' look.

    Every panel needs a kind (bar or line), a y label ending in its unit in
    parentheses, x values, and series whose lengths match the x values.

    Args:
        spec: the plot's description (see the module's docstring).

    Raises:
        ValueError: naming the panel and what is wrong with it.
    """
    panels = spec.get("panels")
    if not panels:
        raise ValueError("a plot needs at least one panel")
    for i, p in enumerate(panels):
        where = f"panel {i} ({p.get('title') or spec.get('title')!r})"
        if p.get("kind") not in ("bar", "line"):
            raise ValueError(f"{where}: kind must be 'bar' or 'line', not {p.get('kind')!r}")
        if not UNIT_RE.search(p.get("ylabel", "")):
            raise ValueError(f"{where}: the y label {p.get('ylabel')!r} must end in its unit in parentheses, "
                             "e.g. 'time (ms)'; put quantities of other units in panels of their own")
        if not p.get("x") or not p.get("series"):
            raise ValueError(f"{where}: no x values or no series")
        for label, values in p["series"].items():
            if len(values) != len(p["x"]):
                raise ValueError(f"{where}: series {label!r} has {len(values)} values for {len(p['x'])} x values")


def _legend_columns(labels: list, width_in: float) -> int:
    """As many legend columns as the longest label lets fit in ``width_in`` inches."""
    longest = max(len(str(s)) for s in labels)
    per_column = 0.55 * FONT_PT / 72 * longest + 0.6  # characters, plus the marker and the gap
    return max(1, min(len(labels), int(width_in // per_column)))


def _value(v: float) -> str:
    """A bar's value as its label shows it: 9,300 / 42.1 / 0.693."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _present(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def _draw_bar(ax, p: dict) -> None:
    series = p["series"]
    xs = range(len(p["x"]))
    # in each category, the bars of the series that have a value there, side by side and centred
    here = [[label for label, values in series.items() if _present(values[x])] for x in xs]
    width = 0.8 / max(1, max(len(h) for h in here))
    for label, values in series.items():
        at = [x for x in xs if _present(values[x])]
        offsets = [x + (here[x].index(label) - (len(here[x]) - 1) / 2) * width for x in at]
        bars = ax.bar(offsets, [values[x] for x in at], width=width, label=label)
        if len(series) * len(p["x"]) <= 12:
            ax.bar_label(bars, fmt=_value, fontsize=MIN_FONT_PT, padding=2)
    ax.set_xticks(list(xs), [str(x) for x in p["x"]])
    ax.grid(False, axis="x")
    if p.get("log"):
        ax.set_yscale("log")
    ax.margins(y=0.12)  # room above the tallest bar for its value


def _spans_widely(p: dict) -> bool:
    values = [v for vs in p["series"].values() for v in vs if _present(v) and v > 0]
    return bool(values) and max(values) > LOG_SPAN * min(values)


def _draw_line(ax, p: dict) -> None:
    styles = p.get("styles", {})
    for i, (label, values) in enumerate(p["series"].items()):
        ax.plot(p["x"], values, styles.get(label, MARKERS[i % len(MARKERS)] + "-"), label=label)
    ax.set_xticks(p["x"])
    if p.get("log") or _spans_widely(p):
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0)


def render(spec: dict):
    """Draw ``spec`` (see the module's docstring) and return the matplotlib figure.

    Args:
        spec: the plot's description; checked first with ``check_spec``.

    Raises:
        ValueError: the spec breaks a rule (``check_spec``).
    """
    check_spec(spec)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = spec["panels"]
    names = [list(p["series"]) for p in panels]
    shared = all(n == names[0] for n in names)
    rows = _legend_rows(panels, shared)
    height = 4.2 + 0.28 * rows
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, len(panels), figsize=(WIDTH_IN, height), layout="constrained", squeeze=False)
        for ax, p in zip(axes[0], panels):
            (_draw_bar if p["kind"] == "bar" else _draw_line)(ax, p)
            ax.set_ylabel(p["ylabel"])
            if p.get("xlabel"):
                ax.set_xlabel(p["xlabel"])
            if p.get("title") and len(panels) > 1:
                ax.set_title(p["title"])
            if not shared:
                ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16 if p.get("xlabel") else -0.09),
                          ncols=_legend_columns(list(p["series"]), WIDTH_IN / len(panels)), frameon=False)
        if shared:
            fig.legend(*axes[0][0].get_legend_handles_labels(), loc="outside lower center",
                       ncols=_legend_columns(names[0], WIDTH_IN), frameon=False)
        title = spec.get("title") or (panels[0].get("title") if len(panels) == 1 else "")
        if title:
            fig.suptitle(title)
    return fig


def _legend_rows(panels: list, shared: bool) -> int:
    """How many lines the legends take (the figure grows by as many)."""
    if shared:
        labels = list(panels[0]["series"])
        return math.ceil(len(labels) / _legend_columns(labels, WIDTH_IN))
    return max(math.ceil(len(p["series"]) / _legend_columns(list(p["series"]), WIDTH_IN / len(panels)))
               for p in panels)


def draw(spec: dict, png_path: str) -> str:
    """Draw ``spec`` into the PNG ``png_path`` and return that path.

    Args:
        spec: the plot's description (see the module's docstring).
        png_path: where the PNG goes; its folder must exist.

    Raises:
        ValueError: the spec breaks a rule (``check_spec``).
    """
    import matplotlib.pyplot as plt

    fig = render(spec)
    fig.savefig(png_path, dpi=DPI)
    plt.close(fig)
    return png_path


def save(name: str, spec: dict, folder: str) -> str:
    """Write ``folder/name.json`` (the spec) and ``folder/name.png`` (its drawing); return the PNG's path.

    Args:
        name: the plot's name (the benchmark's, as the docs page knows it).
        spec: the plot's description (see the module's docstring).
        folder: created if missing.

    Raises:
        ValueError: the spec breaks a rule (``check_spec``); nothing is written then.
    """
    check_spec(spec)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=1)
        f.write("\n")
    return draw(spec, os.path.join(folder, f"{name}.png"))


def redraw(folder: str) -> list:
    """Redraw every ``NAME.json`` of ``folder`` into ``NAME.png``; return the PNGs' paths.

    Args:
        folder: a folder of saved plots (``benchmarks/results/``, ``docs/reference-plots/``).

    Raises:
        ValueError: a saved spec breaks a rule (``check_spec``).
        OSError: the folder cannot be read.
    """
    out = []
    for entry in sorted(os.listdir(folder)):
        if entry.endswith(".json"):
            with open(os.path.join(folder, entry), encoding="utf-8") as f:
                spec = json.load(f)
            out.append(draw(spec, os.path.join(folder, entry[:-5] + ".png")))
    return out


if __name__ == "__main__":
    folders = sys.argv[1:] or [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "reference-plots")]
    for folder in folders:
        for path in redraw(folder):
            print(f"redrew {path}")
