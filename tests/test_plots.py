"""The benchmark plots are readable in the docs: one unit per axis, legends off the data, fonts large enough.

Checked on the drawings themselves (matplotlib, no browser): every committed
reference plot of ``docs/reference-plots/`` is redrawn from the JSON saved
beside it, and its figure is inspected.
"""

import glob
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "docs", "reference-plots")
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import plots  # noqa: E402  (benchmarks/ is not a package)

SPECS = sorted(glob.glob(os.path.join(REFERENCE, "*.json")))


def _load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def test_every_reference_plot_can_be_redrawn_from_its_data():
    pngs = {os.path.basename(p)[:-4] for p in glob.glob(os.path.join(REFERENCE, "*.png"))}
    specs = {os.path.basename(p)[:-5] for p in SPECS}
    assert pngs and pngs == specs, f"plots without data: {sorted(pngs - specs)}; data without plot: {sorted(specs - pngs)}"


@pytest.mark.parametrize("path", SPECS, ids=lambda p: os.path.basename(p)[:-5])
def test_reference_plot_is_readable(path):
    import matplotlib.pyplot as plt

    fig = plots.render(_load(path))
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        assert fig.get_figwidth() == pytest.approx(plots.WIDTH_IN)
        axes = fig.get_axes()
        for ax in axes:
            label = ax.get_ylabel()
            assert plots.UNIT_RE.search(label), f"y axis {label!r} names no unit"
        # one unit per axis: no y label of the figure mixes two units (the group plot once had "time" for s and ms)
        for ax in axes:
            ticks = [t.get_text() for t in ax.get_xticklabels()]
            assert not any(plots.UNIT_RE.search(t) for t in ticks), f"units in the x categories {ticks}: one panel each"
        legends = [ax.get_legend() for ax in axes if ax.get_legend()] + list(fig.legends)
        assert legends, "no legend"
        for legend in legends:
            box = legend.get_window_extent(renderer)
            for ax in axes:
                assert not box.overlaps(ax.get_window_extent(renderer)), "a legend covers the data"
        for text in fig.findobj(match=lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text")):
            if text.get_text().strip() and text.get_visible():
                assert text.get_fontsize() >= plots.MIN_FONT_PT, f"{text.get_text()!r} at {text.get_fontsize()} pt"
    finally:
        plt.close(fig)


def test_a_plot_without_a_unit_or_with_mismatched_series_is_refused(tmp_path):
    good = plots.bar(["4 workers"], {"raw Ray": [1.5], "rlinf": [1.4]}, "time (ms)")
    plots.check_spec({"panels": [good]})
    with pytest.raises(ValueError, match="unit"):
        plots.check_spec({"panels": [dict(good, ylabel="time")]})
    with pytest.raises(ValueError, match="values"):
        plots.check_spec({"panels": [dict(good, series={"rlinf": [1.0, 2.0]})]})
    with pytest.raises(ValueError, match="at least one panel"):
        plots.check_spec({"panels": []})
    with pytest.raises(ValueError):
        plots.save("bad", {"panels": [dict(good, ylabel="time")]}, str(tmp_path))
    assert not os.listdir(tmp_path), "a refused plot wrote files"


def test_saved_data_redraws_the_same_plot(tmp_path):
    spec = {"title": "t", "panels": [plots.line([1, 2, 4], {"a": [1, 2, 3], "b": [2, 2, 2]}, "time (s)", "receivers (N)"),
                                     plots.bar(["x", "y"], {"c": [10, 1000]}, "throughput (items/s)", log=True)]}
    png = plots.save("demo", spec, str(tmp_path))
    assert _load(tmp_path / "demo.json") == json.loads(json.dumps(spec))
    os.remove(png)
    assert plots.redraw(str(tmp_path)) == [png] and os.path.getsize(png) > 0
    from PIL import Image

    with Image.open(png) as im:
        assert im.size[0] == round(plots.WIDTH_IN * plots.DPI)


def test_a_line_panel_spanning_widely_is_logarithmic_and_its_series_keep_apart():
    """The weights plot: one slow point (Ray's object store to 1 receiver, 1 s against 0.02-0.9 s) squeezed the
    rest against the axis, and two series ran together near zero with the same marker."""
    import matplotlib.pyplot as plt

    spec = _load(os.path.join(REFERENCE, "weights.json"))
    fig = plots.render(spec)
    try:
        (ax,) = fig.get_axes()
        assert ax.get_yscale() == "log"
        styled = spec["panels"][0].get("styles", {})
        markers = [line.get_marker() for line in ax.get_lines() if line.get_label() not in styled]
        assert len(markers) == len(set(markers)) >= 6, markers
    finally:
        plt.close(fig)
    narrow = plots.line([1, 2], {"a": [1.0, 2.0]}, "time (s)", "n")
    fig = plots.render({"panels": [narrow]})
    try:
        assert fig.get_axes()[0].get_yscale() == "linear"  # values within LOG_SPAN: a linear axis from 0
    finally:
        plt.close(fig)


def test_a_baseline_of_one_category_has_bars_there_only():
    """The channel-load plot: a series whose value is null in a category draws no bar there, so a baseline
    measured for one category is not shown (and labelled) under the other."""
    import matplotlib.pyplot as plt

    spec = _load(os.path.join(REFERENCE, "channel_load.json"))
    fig = plots.render(spec)
    try:
        (ax,) = fig.get_axes()
        ticks = {round(t): label.get_text() for t, label in zip(ax.get_xticks(), ax.get_xticklabels())}
        where = {}
        for container in ax.containers:
            where[container.get_label()] = [ticks[round(bar.get_x() + bar.get_width() / 2)] for bar in container]
        assert where["rlinf Channel, no slow consumer"] == ["beside a slow consumer"], where
        assert where["8 Ray Queues"] == ["all keys"], where
        assert not any("no slow consumer" in label and "all keys" in cats for label, cats in where.items()), where
        texts = [t.get_text() for t in ax.texts]
        assert texts and not any("nan" in t for t in texts), texts
    finally:
        plt.close(fig)
