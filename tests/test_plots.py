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
