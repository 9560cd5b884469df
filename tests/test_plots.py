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
