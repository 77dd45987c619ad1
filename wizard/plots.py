"""Render probe artifacts (line and bar plots, image grids) to PNG files with matplotlib."""

from __future__ import annotations

import math
from pathlib import Path

from nnwizard.probes.api import BarPlot, ImageGrid, LinePlot


def _finite(values):
    return [v if isinstance(v, (int, float)) and math.isfinite(v) else float("nan") for v in values]


def _wide(series) -> bool:
    """Positive values over more than three decades: a linear axis would flatten all but the largest."""
    values = [v for vs in series for v in _finite(vs) if not math.isnan(v)]
    return bool(values) and min(values) > 0 and max(values) > 1e3 * min(values)


def _plain_labels(ax, series) -> None:
    """A log axis over less than two decades labels its ticks 6 and 7, not 6x10^0 and 7x10^0."""
    from matplotlib.ticker import FuncFormatter

    values = [v for vs in series for v in _finite(vs) if not math.isnan(v) and v > 0]
    if values and max(values) < 100 * min(values):
        plain = FuncFormatter(lambda v, _: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)


def render(artifact, folder: Path, prefix: str) -> Path | None:
    """Draw one artifact into ``folder``; returns the PNG path, or None for non-graphic artifacts."""
    if not isinstance(artifact, (LinePlot, BarPlot, ImageGrid)):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{prefix}-{artifact.name}.png"
    if isinstance(artifact, ImageGrid):
        n = max(len(artifact.images), 1)
        fig, axes = plt.subplots(1, n, figsize=(2.0 * n, 2.4), squeeze=False)
        for ax, image, caption in zip(axes[0], artifact.images, artifact.captions):
            ax.imshow(image, cmap="gray", vmin=0.0, vmax=1.0)
            ax.set_title(caption, fontsize=8)
            ax.axis("off")
    else:
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        if isinstance(artifact, LinePlot):
            for label, values in artifact.series.items():
                xs = artifact.xs.get(label, artifact.x)
                xs = xs if xs is not None and len(xs) == len(values) else range(len(values))
                ax.plot(list(xs), _finite(values), label=label, marker="." if len(values) < 40 else None)
            for label, x in artifact.marks.items():
                ax.axvline(x, color="red", linestyle="--", linewidth=1)
                ax.annotate(label, (x, 1), xycoords=("data", "axes fraction"), fontsize=8, color="red",
                            va="top", ha="left")
            if (artifact.logy and any(v > 0 for vs in artifact.series.values() for v in _finite(vs))) or _wide(artifact.series.values()):
                ax.set_yscale("log")  # (a log axis with nothing positive to show makes matplotlib raise)
                _plain_labels(ax, artifact.series.values())
            if artifact.logx:
                ax.set_xscale("log")
            ax.set_xlabel(artifact.xlabel)
            if len(artifact.series) > 1:
                ax.legend(fontsize=8)
        else:
            ax.bar(range(len(artifact.values)), _finite(artifact.values))
            ax.set_xticks(range(len(artifact.labels)))
            ax.set_xticklabels(artifact.labels, rotation=45, ha="right", fontsize=7)
            if artifact.logy and any(v > 0 for v in _finite(artifact.values)):
                ax.set_yscale("log")
        ax.set_ylabel(artifact.ylabel)
        ax.grid(alpha=0.3)
    fig.suptitle(artifact.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
