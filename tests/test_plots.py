from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

from nnwizard.plots import _wide, render
from nnwizard.probes.api import LinePlot


def test_losses_over_decades_get_a_log_axis(tmp_path, monkeypatch):
    import matplotlib.axes

    scales = []
    real = matplotlib.axes.Axes.set_yscale
    monkeypatch.setattr(matplotlib.axes.Axes, "set_yscale", lambda self, v, **k: (scales.append(v), real(self, v, **k)))
    wide = LinePlot("w", "lr sweep", {"lr x0.1": [2.3, 0.5, 0.1], "lr x10": [2.3, 400.0, 1800.0, math.nan]})
    narrow = LinePlot("n", "loss", {"loss": [2.3, 1.9, 1.2]})
    assert render(wide, tmp_path, "p").exists() and scales == ["log"]
    assert render(narrow, tmp_path, "p").exists() and scales == ["log"]  # a narrow range stays linear


def test_wide_needs_positive_values():
    assert _wide([[1e-4, 1.0, 10.0]])
    assert not _wide([[0.0, 1.0, 1e5]]) and not _wide([[1.0, 2.0]]) and not _wide([[math.nan]])


def test_a_narrow_log_axis_labels_its_ticks_as_plain_numbers():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from nnwizard.plots import _plain_labels

    fig, ax = plt.subplots()
    ax.plot([7.6, 6.8, 6.1, 5.8])
    ax.set_yscale("log")
    _plain_labels(ax, [[7.6, 6.8, 6.1, 5.8]])   # a language model's loss: 6 and 7, not 6x10^0
    assert isinstance(ax.yaxis.get_major_formatter(), FuncFormatter) and ax.yaxis.get_minor_formatter()(6.0, 0) == "6"
    wide = plt.subplots()[1]
    wide.set_yscale("log")
    _plain_labels(wide, [[10.0, 0.01]])   # three decades: matplotlib's own 10^k labels stay
    assert not isinstance(wide.yaxis.get_major_formatter(), FuncFormatter)
    plt.close("all")
