"""Lecture figures: the expected elements, numbers that match fpemu.stats, same bytes twice."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest

import fpemu
from fpemu import plotting as fp

matplotlib.use("Agg")


@pytest.fixture
def grads():
    rng = np.random.default_rng(0)
    g = rng.integers(1, 2**20, 5000) * 2.0**-20 * 2.0 ** rng.integers(-40, -5, 5000)
    return np.concatenate([np.zeros(1000), g])


def test_underflow_histogram_has_bins_zero_bin_strips_and_exact_shares(grads):
    ax = fp.plot_underflow_histogram(grads, ["fp16", "e5m2"], scale=1024)
    assert ax.get_xlabel().startswith("|value|") and ax.get_ylabel() == "% of values"
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "0" and all(t.startswith("$2^{") for t in labels[1:])
    bars = [p for p in ax.patches if type(p).__name__ == "Rectangle"]
    heights = sorted(round(p.get_height(), 9) for p in bars)
    assert round(100 * 1000 / 6000, 9) in heights          # the zero bin, in percent
    strip = ax.fpemu_strip
    assert [t.get_text() for t in strip.get_yticklabels()] == ["fp16", "e5m2"]
    assert len(strip.collections) >= 6                    # bands: 3-4 regions per format
    texts = [t.get_text() for t in ax.fpemu_annotations]
    c1, cs = fpemu.stats(grads, "fp16"), fpemu.stats(grads, "fp16", scale=1024)
    assert texts[0] == f"{100 * c1.fraction('flushed'):.1f}% → " \
                       f"{100 * cs.fraction('flushed'):.1f}%"
    assert any(line.get_label().startswith("values × 1024") for line in ax.patches +
               list(ax.get_children()) if hasattr(line, "get_label"))
    plt.close(ax.figure)


def test_underflow_histogram_log_variant_and_single_format_shading(grads):
    ax = fp.plot_underflow_histogram(grads, "fp16", yscale="log")
    assert ax.get_yscale() == "log"
    spans = [p for p in ax.patches if type(p).__name__ == "Rectangle" and p.get_alpha() == 0.13]
    assert len(spans) >= 3                                 # flushed, subnormal, normal bands
    with pytest.raises(fpemu.errors.FpemuValueError, match="yscale must be"):
        fp.plot_underflow_histogram(grads, "fp16", yscale="loglog")
    plt.close("all")


def test_format_regions_are_the_format_facts():
    r = fp.format_regions("fp16")
    assert r["flushed"][1] == -25 and r["subnormal"] == (-25, -14)
    assert r["overflow"][0] == np.log2(65504)


def test_layer_histograms_one_row_per_layer_with_shares(grads):
    layers = {"l1": grads, "l2": grads * 2.0**-8}
    ax = fp.plot_layer_histograms(layers, "fp16")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["l1", "l2"]
    flushed = fpemu.stats(grads * 2.0**-8, "fp16").fraction("flushed")
    assert ax.fpemu_annotations[1].get_text().startswith(f"{100 * flushed:.1f}% flushed")
    plt.close(ax.figure)


def test_number_line_bit_layout_and_curves():
    ax = fp.plot_number_line(["e4m3fn", "e5m2"], lo=2.0**-20, hi=2.0**17)
    counts = [t.get_text() for t in ax.texts]
    assert "126 shown" in counts and "123 shown" in counts   # positive finite codes
    plt.close(ax.figure)
    ax = fp.plot_bit_layout(["fp16", "e4m3fn"], value=1.0)
    assert len(ax.patches) == 16 + 8
    bits = "".join(t.get_text() for t in ax.texts if t.get_text() in "01")
    assert bits[:16] == "0011110000000000" and bits[16:24] == "00111000"
    plt.close(ax.figure)
    ax = fp.plot_training_curves({"fp16": [1.0, 0.5, float("nan")], "fp32": [1.0, 0.5, 0.25]},
                                 reference="fp32")
    assert any("NaN at step 2" in t.get_text() for t in ax.texts)
    plt.close(ax.figure)
    ax = fp.plot_loss_scale([0, 1, 2], [4.0, 2.0, 2.0], [True, False, False])
    assert ax.get_yscale() == "log" and "skipped step (1)" in \
        [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(ax.figure)


def test_save_figure_writes_svg_pdf_png_with_the_same_bytes_twice(tmp_path, grads):
    paths = []
    for i in range(2):
        ax = fp.plot_underflow_histogram(grads, ["fp16", "bf16"], scale=8)
        paths.append(fp.save_figure(ax.figure, tmp_path / f"run{i}" / "hist"))
        plt.close(ax.figure)
    assert [p.rsplit(".", 1)[1] for p in paths[0]] == ["svg", "pdf", "png"]
    from pathlib import Path
    for a, b in zip(*paths):
        assert Path(a).read_bytes() == Path(b).read_bytes(), a
    svg = Path(paths[0][0]).read_text()
    assert "<text" in svg and "Date" not in svg            # text stays text, no date
    assert Path(paths[0][2]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_survey_counts_every_format_and_scale_in_one_pass(grads):
    chunks = (grads[i:i + 1000] for i in range(0, grads.size, 1000))   # read once
    seen = []
    sv = fpemu.stats.survey(chunks, ["fp16", "e4m3fn"], scales=(1, 64), progress=seen.append)
    assert sum(seen) == grads.size
    for f in ("fp16", "e4m3fn"):
        for s in (1, 64):
            assert sv[f, s] == fpemu.stats(grads, f, scale=s)
    with pytest.raises(fpemu.errors.FpemuValueError, match="no counts for \\(bf16"):
        sv["bf16", 1]
    # stochastic rounding: the same counts as one call, however the data are cut
    parts = [grads[:1234], grads[1234:]]
    sr = fpemu.stats.survey(parts, "e4m3fn", scales=(2.0**20,), rounding="sr", seed=7,
                            chunk=100)
    assert sr["e4m3fn", 2.0**20] == fpemu.stats(grads, "e4m3fn", scale=2.0**20, rounding="sr",
                                                seed=7)


def test_new_axes_keeps_the_interactive_mode_a_backend_turns_on(monkeypatch):
    # Jupyter's inline backend is chosen at the first figure and turns interactive
    # mode on then; a style context restoring rcParams on exit used to turn it off
    # again, and every later figure of the notebook stayed hidden.
    was = matplotlib.is_interactive()
    matplotlib.interactive(False)
    real = plt.subplots

    def subplots_as_a_backend_switch(*a, **k):
        matplotlib.interactive(True)
        return real(*a, **k)

    monkeypatch.setattr(plt, "subplots", subplots_as_a_backend_switch)
    try:
        fig, _ = fp.new_axes()
        assert matplotlib.is_interactive()
        plt.close(fig)
        matplotlib.interactive(False)
        monkeypatch.setattr(plt, "subplots", real)
        fig, _ = fp.new_axes()                  # and it does not turn it on by itself
        assert not matplotlib.is_interactive()
        plt.close(fig)
    finally:
        matplotlib.interactive(was)


def test_plot_rounding_draws_every_mode_where_quantize_sends_it():
    ax = fp.plot_rounding(2.5, "e2m1")
    labels = [t.get_text() for t in ax.texts]
    for want in ("2", "3"):
        assert want in labels
    ends = sorted({round(float(line.get_xdata()[0]), 6) for line in ax.lines
                   if line.get_marker() == "o"})
    assert ends == [2.0, 3.0]
    assert [t.get_text() for t in ax.get_yticklabels()][0] == "e2m1 values"
    plt.close(ax.figure)
    with pytest.raises(fpemu.errors.FpemuValueError, match="x must be finite"):
        fp.plot_rounding(float("inf"), "e2m1")


def test_plot_heatmap_masks_missing_cells_and_checks_the_shape():
    v = np.array([[0.0, 0.5], [np.nan, 1.0]])
    ax = fp.plot_heatmap(v, ["a", "b"], [0, 1], title="t")
    img = ax.images[0].get_array()
    assert img.mask.tolist() == [[False, False], [True, False]] and img[1, 1] == 100
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    plt.close(ax.figure)
    with pytest.raises(fpemu.errors.FpemuValueError, match=r"expected \(2, 3\)"):
        fp.plot_heatmap(v, ["a", "b"], [0, 1, 2])
