"""``nnwizard curve FILE``: read an existing loss log, name its shape, and say what to do first.

Reads CSV/TSV (step / loss / val_loss style columns), JSON lines or a JSON array, one number per
line, and TensorBoard event files when ``tensorboard`` is installed. Prints sparklines, the shape,
the step of the event (NaN, divergence, best validation step), the first intervention and what the
learning rate has to do with it; ``--json`` and ``--report`` (markdown with a PNG) write the same.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Console

from nnwizard.console import make_console
from nnwizard.curves import Curves, Shape, classify, read_log, sparkline
from nnwizard.errors import UsageError


def analyse(path: str | Path, reference: float | None = None) -> tuple[Curves, Shape]:
    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path}: no such file")
    try:
        curves = read_log(path)
    except (ValueError, json.JSONDecodeError, UnicodeError) as exc:
        raise UsageError(f"{path}: cannot read a loss log: {exc}") from None
    if not curves.train:
        raise UsageError(f"{path}: the log has a loss column but no values")
    return curves, classify(curves, reference)


def as_json(curves: Curves, shape: Shape) -> dict:
    def clean(values):
        return None if values is None else [v if math.isfinite(v) else str(v) for v in values]

    return {
        "file": curves.source, "columns": curves.columns, "points": len(curves.train),
        "shape": shape.shape, "title": shape.title, "normal": shape.normal, "step": shape.step,
        "symptoms": shape.symptoms, "evidence": shape.evidence, "intervention": shape.intervention,
        "learning_rate": shape.lr,
        "data": {k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in shape.data.items()},
        "steps": curves.x(), "train": clean(curves.train), "val_steps": curves.vx() or None, "val": clean(curves.val),
    }


def write_report(curves: Curves, shape: Shape, path: str | Path) -> Path:
    from nnwizard.plots import render
    from nnwizard.probes.api import LinePlot

    path = Path(path)
    assets = path.parent / f"{path.stem}_files"
    xs = curves.x()
    series = {"train": curves.train}
    if curves.val:
        # validation on the training x axis: each value held until the next logged point
        vx, stretched, j = curves.vx(), [], 0
        for x in xs:
            while j + 1 < len(vx) and vx[j + 1] <= x:
                j += 1
            stretched.append(curves.val[j] if vx and vx[0] <= x else math.nan)
        series["validation"] = stretched
    finite = [v for s in series.values() for v in s if isinstance(v, float) and math.isfinite(v)]
    marks = {f"{shape.shape} @ {shape.step}": float(shape.step)} if shape.step is not None else {}
    plot = LinePlot("curve", f"{Path(curves.source).name}: {shape.title}", series, x=list(xs), marks=marks,
                    logy=bool(finite) and min(finite) > 0 and max(finite) / min(finite) > 30)
    png = render(plot, assets, "curve")
    lines = [f"# Loss curve: `{curves.source}`", "",
             f"**Shape: {shape.title}**" + (f" at step {shape.step}" if shape.step is not None else ""), "",
             f"- Measured: {shape.evidence}", f"- First intervention: {shape.intervention}",
             f"- Learning rate: {shape.lr}",
             f"- Symptoms (CONTRACT): {', '.join(shape.symptoms) or 'none (normal)'}", ""]
    if png is not None:
        lines += [f"![loss curve]({assets.name}/{png.name})", ""]
    lines += [f"Columns read: {', '.join(f'{k} = `{v}`' for k, v in curves.columns.items())}; {len(curves.train)} points.", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def run(path: Path, json_path: Path | None = None, report_path: Path | None = None, reference: float | None = None,
        console: Console | None = None) -> int:
    console = console or make_console()
    curves, shape = analyse(path, reference)
    console.print(f"[bold]{curves.source}[/bold]  ({len(curves.train)} points; columns "
                  f"{', '.join(f'{k}={v}' for k, v in curves.columns.items())})", highlight=False)
    console.print(f"  train {sparkline(curves.train)}", highlight=False)
    if curves.val:
        console.print(f"  val   {sparkline(curves.val)}", highlight=False)
    colour = "green" if shape.normal else "red"
    at = f" at step {shape.step}" if shape.step is not None else ""
    console.print(f"[{colour}]shape: {shape.title}{at}[/{colour}]", highlight=False)
    console.print(f"  measured: {shape.evidence}", highlight=False)
    console.print(f"  first intervention: {shape.intervention}", highlight=False)
    console.print(f"  learning rate: {shape.lr}", highlight=False)
    if json_path:
        Path(json_path).write_text(json.dumps(as_json(curves, shape), indent=2), encoding="utf-8")
        console.print(f"  wrote {json_path}", highlight=False)
    if report_path:
        write_report(curves, shape, report_path)
        console.print(f"  wrote {report_path}", highlight=False)
    return 0
