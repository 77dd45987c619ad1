"""Loss-curve shapes: read a training log and say which of a handful of recognisable shapes it has.

A loss curve is an instrument, not a score. Each shape points at a different cause and a different
first intervention, and they are not interchangeable (raising the learning rate cures a flat curve
and causes NaN; lowering it does the opposite). This module is shared by the ``triage-run`` probe
(``--symptom auto``) and the ``nnwizard curve FILE`` command.

Shapes (``Shape.shape``): ``nan`` (non-finite from the start or without prior progress), ``diverged``
(healthy, then blew up at step k), ``flat`` (does not move), ``oscillating`` (large jumps, no
progress), ``overfitting`` (train falls while validation rises; best step), ``stalled-high`` (both
stall far above zero), ``plateau`` (fell, then levelled: normal) and ``falling`` (still improving:
normal). Every threshold is a fraction of the curve's own reference scale (its starting level, or
the chance-level loss when the caller knows it), so the rules hold for any loss and any units.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# ------------------------------------------------------------------------------------- the shapes
# id -> (title, CONTRACT §2 symptoms, first intervention, what the learning rate has to do with it)
SHAPES: dict[str, tuple[str, list[str], str, str]] = {
    "nan": (
        "NaN/Inf without a healthy phase before it",
        ["nan"],
        "Find the first non-finite value: check the inputs for NaN/Inf, guard log/divide/sqrt against "
        "zero (add an epsilon), and look at the gradient norm in the steps before it.",
        "Lowering the learning rate is the right move when the loss grew for a few steps before turning "
        "NaN; when it is NaN at the very first step the learning rate cannot be the cause (no update has "
        "happened yet): the data or an unguarded operation is.",
    ),
    "diverged": (
        "healthy, then diverged",
        ["nan"],
        "Look at what happened at that step: the batch it read (a corrupt or extreme sample, a NaN "
        "input), the gradient norm there; add gradient clipping and check the data loader.",
        "Not a configuration problem: the same learning rate trained well until that step, so lowering "
        "it globally only hides a data or numerics event (a warm-up or clipping is the gentler fix).",
    ),
    "flat": (
        "flat from the start",
        ["flat"],
        "Check that a learning signal reaches the parameters: backward() and optimizer.step() every "
        "step, the optimizer built over the model's parameters, nothing detached or frozen.",
        "Raising the learning rate helps only if the parameters already move a little; if they do not "
        "move at all, no learning rate will change that. A far-too-low rate is the last suspect, not "
        "the first.",
    ),
    "oscillating": (
        "violent oscillation without progress",
        ["oscillating"],
        "Lower the learning rate (3-10x) or enlarge the batch; check that the labels agree with the "
        "inputs (shuffled labels also look like noise).",
        "Lowering the learning rate is the usual first intervention here; raising it makes it worse.",
    ),
    "overfitting": (
        "train falls while validation rises",
        ["overfitting"],
        "Keep the weights from the best validation step (early stopping), then regularise: weight "
        "decay, dropout, data augmentation, more data or a smaller model.",
        "The learning rate is not the lever: the optimisation works, the model memorises. Changing it "
        "only moves the best step earlier or later.",
    ),
    "stalled-high": (
        "the loss stalls high",
        ["underfitting"],
        "Check that the model can fit at all: overfit one small batch; if it can, give the model more "
        "capacity (or nonlinearities), train longer and relax regularisation.",
        "A too-low learning rate can look like this; try raising it about 3x only after the one-batch "
        "test passes. If one batch cannot be overfit, the bug is in data, loss or loop, not the rate.",
    ),
    "plateau": (
        "smooth fall, then plateau (normal)",
        [],
        "Normal training. Whether it can go lower is a scheduling question: decay the learning rate at "
        "the plateau (step, cosine or ReduceLROnPlateau) and compare with the validation loss.",
        "Do not raise it; lowering it once the plateau is reached is the standard next step.",
    ),
    "falling": (
        "still falling (normal)",
        [],
        "Nothing is wrong with the shape: the loss is still improving, so train for longer.",
        "No change needed; the current learning rate is making progress.",
    ),
    "unbounded": (
        "below zero, falling faster and faster",
        [],
        "Check the sign of what backward() receives: a loss function's value passed as it is, a log-likelihood with "
        "its minus sign, two scores subtracted in the right order. A loss that can fall without bound is being "
        "climbed the wrong way.",
        "Not a learning-rate problem: any rate follows the wrong direction, faster or slower.",
    ),
    "spiked": (
        "an early blow-up the run then recovered from",
        ["oscillating"],
        "The first updates threw the model far off its starting loss; the rest of the run spent its steps "
        "climbing back. Lower the peak learning rate, or warm it up over the first few percent of the steps "
        "(a schedule that starts at full rate on a fresh model overshoots), then compare the curves.",
        "Lower it (or add a warm-up) and compare: a run that does not blow up at the start ends lower for the "
        "same steps.",
    ),
    "too-short": (
        "too few points to read a shape",
        [],
        "Log more points (at least a few dozen steps) and read the curve again.",
        "Nothing can be said about the learning rate from so few points.",
    ),
}

NORMAL = ("plateau", "falling", "too-short")


@dataclass
class Curves:
    """Series read from a log or measured by a run. ``steps``/``val_steps`` are the x positions."""

    train: list[float]
    steps: list[float] | None = None
    val: list[float] | None = None
    val_steps: list[float] | None = None
    train_acc: list[float] | None = None
    val_acc: list[float] | None = None
    source: str = ""
    columns: dict[str, str] = field(default_factory=dict)

    def x(self) -> list[float]:
        return self.steps if self.steps and len(self.steps) == len(self.train) else list(range(len(self.train)))

    def vx(self) -> list[float]:
        if not self.val:
            return []
        if self.val_steps and len(self.val_steps) == len(self.val):
            return self.val_steps
        # validation logged without positions: spread it evenly over the training steps
        xs = self.x()
        n = len(self.val)
        return [xs[min(len(xs) - 1, round((i + 1) * len(xs) / n) - 1)] for i in range(n)] if xs else list(range(n))


@dataclass
class Shape:
    shape: str
    title: str
    symptoms: list[str]
    evidence: str
    intervention: str
    lr: str
    step: float | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def normal(self) -> bool:
        return self.shape in NORMAL

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------- helpers
def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def _median(values: list[float]) -> float:
    values = [v for v in values if _finite(v)]
    return statistics.median(values) if values else math.nan


def smooth(values: list[float], window: int) -> list[float]:
    """Running median (robust to single spikes) with an odd window, ignoring non-finite points."""
    half = max(window, 1) // 2
    return [_median(values[max(0, i - half): i + half + 1]) for i in range(len(values))]


def _fmt(v: float) -> str:
    return f"{v:.4g}" if _finite(v) else str(v)


def _at(xs: list[float], i: int) -> float:
    x = xs[i]
    return int(x) if float(x).is_integer() else x


def _make(shape: str, evidence: str, step: float | None = None, **data: Any) -> Shape:
    title, symptoms, intervention, lr = SHAPES[shape]
    return Shape(shape, title, list(symptoms), evidence, intervention, lr, step, data)


def _went(start: float, end: float) -> str:
    """How the loss went from ``start`` to ``end``, in the words its numbers allow."""
    if end < start:
        return f"fell from {_fmt(start)} to {_fmt(end)}"
    if end > start:
        return f"rose from {_fmt(start)} to {_fmt(end)}"
    return f"stayed at {_fmt(start)}"


# ------------------------------------------------------------------------------------- classifier
# Thresholds, all relative to the reference scale R (the curve's starting level, or the chance-level
# loss when the caller knows it):
#   flat         the first points, the median of every quarter of the run and the end lie within 3%
#                of R of each other (a learning curve moves by more than that within a few dozen steps).
#   oscillating  less than 25% of R progress (first to last quarter), and the typical step-to-step
#                jump is over 25% of R (minibatch noise of a healthy run is ~5-10% of R).
#   oscillating  also: within the first third the loss rises to 2x its first value (and by half of R),
#                and the run ends less than 10% of R below that first value (a blow-up it only undid).
#   spiked       an early blow-up to 1.5x (and half of R) in a run that then ends 10% of R or more below its
#                first value: not normal progress, and what the lr reruns then measure (a lower bar than
#                oscillating's: this shape concludes nothing by itself, the reruns do).
#   diverged     after real, smooth progress (>= 10% of R, step-to-step jumps under 30% of the level),
#                the loss leaves its best level and ends above the starting level (or turns non-finite).
#   overfitting  validation ends at least 5% of R (and 10% of its best value) above its best point,
#                while training loss kept falling after that point and ends below validation.
#   plateau      after real progress, the last third improves by less than 3% of R (normal).
#   stalled-high the last third of the run improves by less than 3% of R while the loss is still above
#                40% of R (and validation too, when there is one): not a slow start but a standstill.
FLAT_RANGE, OSC_PROGRESS, OSC_ROUGH = 0.03, 0.25, 0.25
DIVERGE_PROGRESS = 0.10
OVERFIT_RISE, OVERFIT_REL = 0.05, 0.10
STALL_GAIN, STALL_LEVEL = 0.03, 0.40
PLATEAU_GAIN = 0.03
EARLY_BLOWUP = 2.0   # an early blow-up the run never got below its start from: read as the shape itself (oscillating)
SPIKE_BLOWUP = 1.5   # one the run then learnt from (spiked): a trigger for the lr reruns, which measure it


UNBOUNDED_MIN = 12   # points a curve needs before its descent below zero can be called unbounded


def falls_unbounded(values: list[float]) -> tuple[float, float, float] | None:
    """The medians of a loss curve's three thirds when it ends below zero and falls faster and faster, by more
    than its own first level: a loss with no lower bound (the objective climbed, not minimised; a loss bounded
    below slows down as it nears its minimum). None otherwise, or with fewer than UNBOUNDED_MIN points."""
    n = len(values)
    if n < UNBOUNDED_MIN:
        return None
    k = n // 3
    a, b, c = _median(values[:k]), _median(values[k:2 * k]), _median(values[2 * k:])
    return (a, b, c) if c < 0 and b - c > a - b > 0 and c < a - abs(a) else None


def classify(curves: Curves, reference: float | None = None) -> Shape:
    """The shape of a loss curve (and its validation curve, when given)."""
    train = list(curves.train)
    xs = curves.x()
    n = len(train)
    bad = next((i for i, v in enumerate(train) if not _finite(v)), None)
    if n < 4 and bad is None:
        return _make("too-short", f"only {n} training loss values", points=n)
    window = max(3, (n // 10) | 1)
    head = [v for v in train[:3] if _finite(v)]  # the first points: fast learners leave them quickly
    start = _median(head) if head else math.nan
    scale = reference if reference and reference > 0 else abs(start) if _finite(start) and start != 0 else 1.0
    base = dict(points=n, start=start, reference=scale)

    if bad is not None:
        before = [v for v in train[:bad] if _finite(v)]
        best = min(before) if before else math.nan
        progress = (start - best) / scale if before else 0.0
        value = train[bad]
        if bad >= 3 and progress >= DIVERGE_PROGRESS:
            return _make("diverged", f"the loss fell from {_fmt(start)} to {_fmt(best)} and then became {value} at step "
                         f"{_at(xs, bad)}", _at(xs, bad), nan_step=_at(xs, bad), best=best, **base)
        if before:
            text = f"the loss became {value} at step {_at(xs, bad)} (from {_fmt(start)}, without clear progress before)"
        else:
            text = f"the loss is {value} from the first step"
        return _make("nan", text, _at(xs, bad), nan_step=_at(xs, bad), **base)

    sm = smooth(train, window)
    tail = max(window, n // 5)
    end = _median(train[-tail:])
    lo_i = min(range(n), key=lambda i: sm[i])
    lo = sm[lo_i]
    progress = (start - end) / scale
    # step-to-step jumps measured against the reference scale, not the current level: near zero loss
    # small absolute wiggles are large relative ones, and they are not what "violent" means
    rough = _median([abs(b - a) for a, b in zip(train, train[1:])]) / scale
    base.update(end=end, best=lo, progress=round(progress, 4), roughness=round(rough, 4))

    # healthy, then diverged to a finite but large value
    pre = train[: max(lo_i, 3) + 1]
    rough_pre = _median([abs(b - a) for a, b in zip(pre, pre[1:])]) / max(abs(_median(pre)), 1e-12)
    if (start - lo) / scale >= DIVERGE_PROGRESS and lo_i < n - tail and rough_pre < OSC_ROUGH:
        after = sm[lo_i:]
        jump = next((lo_i + j for j, v in enumerate(after) if v > start), None)
        if jump is not None and end > start:
            raw = next((i for i in range(max(lo_i, jump - window), n) if train[i] > start), jump)
            found = _make("diverged", f"the loss fell from {_fmt(start)} to {_fmt(lo)} by step {_at(xs, lo_i)}, then rose "
                          f"above its starting level at step {_at(xs, raw)} and ended at {_fmt(end)} (finite throughout)",
                          _at(xs, raw), diverge_step=_at(xs, raw), **base)
            found.symptoms = ["oscillating"]  # every value is finite: the symptom the numbers show is not "nan"
            return found

    # blown up at once, then back at (or above) where it began: the first updates threw the model far off its
    # starting level (a learning rate far too high for the optimizer, which the median start above hides) and
    # the rest of the run only undid that
    first = train[0]
    spiked = None
    early = train[: max(n // 3, 3)]
    peak_i = max(range(len(early)), key=lambda i: early[i])
    peak = early[peak_i]
    if n >= 8 and first > 0 and peak >= SPIKE_BLOWUP * first and (peak - first) / scale >= 0.5:
        rose = (f"the loss rose from {_fmt(first)} at step {_at(xs, 0)} (before any update had an effect) to {_fmt(peak)} "
                f"by step {_at(xs, peak_i)}, {peak / first:.1f}x its first value")
        blown = dict(first=first, peak=peak, peak_step=_at(xs, peak_i), peak_ratio=peak / first, **base)
        learnt = (first - end) / scale >= DIVERGE_PROGRESS
        if not learnt and peak >= EARLY_BLOWUP * first:
            return _make("oscillating", f"{rose}, and ended at {_fmt(end)}: no progress below where it began in {n} steps",
                         _at(xs, peak_i), **blown)
        # the same blow-up in a run that went on to learn (smoothly: not a curve that jumps all along, judged
        # below): what it learnt came after undoing the first updates
        if learnt:
            spiked = _make("spiked", f"{rose}, and only then fell, to {_fmt(end)} after {n} steps: the first updates "
                           f"overshoot", _at(xs, peak_i), **blown)

    # flat: the start, every quarter of the run and the end all sit within FLAT_RANGE of each other
    # (quarter medians, so that minibatch noise does not count as movement)
    quarters = [_median(train[i * n // 4: (i + 1) * n // 4]) for i in range(4)]
    levels = [start, *quarters, end]
    span = (max(levels) - min(levels)) / scale
    if span < FLAT_RANGE and rough < OSC_ROUGH:
        return _make("flat", f"over {n} steps the loss does not move: start {_fmt(start)}, end {_fmt(end)}, every "
                     f"quarter within {_fmt(span * scale)} of each other ({span:.1%} of the reference scale {_fmt(scale)})",
                     span=span, **base)
    # progress for the oscillation test from quarter medians: three noisy first points say little
    # about where a jumping curve began (a fast learner has small jumps and never gets here)
    quarter = max(n // 4, 1)
    steady = (_median(train[:quarter]) - _median(train[-quarter:])) / scale
    if steady < OSC_PROGRESS and rough > OSC_ROUGH:
        return _make("oscillating", f"the loss jumps by {rough:.0%} of {_fmt(scale)} from step to step while it only "
                     f"went from {_fmt(start)} to {_fmt(end)} over {n} steps", **base)
    if spiked is not None and rough <= OSC_ROUGH:
        return spiked

    val = [v for v in (curves.val or [])]
    if len(val) >= 3:
        vx = curves.vx()
        vbad = next((i for i, v in enumerate(val) if not _finite(v)), None)
        if vbad is not None:
            return _make("nan", f"the validation loss became {val[vbad]} at step {_at(vx, vbad)} while training "
                         f"loss stayed finite", _at(vx, vbad), nan_step=_at(vx, vbad), **base)
        vs = smooth(val, 3) if len(val) >= 6 else val
        best_i = min(range(len(val)), key=lambda i: vs[i])
        v_best, v_end = vs[best_i], vs[-1]
        rise = v_end - v_best

        def train_at(x: float) -> float:
            j = min(range(n), key=lambda i: abs(xs[i] - x))
            return _median(train[max(0, j - window // 2): j + window // 2 + 1])

        t_best, t_end = train_at(vx[best_i]), end
        base.update(val_best=v_best, val_end=v_end, val_best_step=_at(vx, best_i), train_at_best=t_best, train_end=t_end)
        if (best_i < len(val) - 1 and rise >= OVERFIT_RISE * scale and rise >= OVERFIT_REL * abs(v_best)
                and t_end < t_best - OVERFIT_RISE * scale / 2 and t_end < v_end):
            return _make("overfitting", f"validation loss was best at step {_at(vx, best_i)} ({_fmt(v_best)}) and rose to "
                         f"{_fmt(v_end)} while training loss kept falling ({_fmt(t_best)} -> {_fmt(t_end)})",
                         _at(xs, 0) if best_i < 0 else _at(vx, best_i), best_step=_at(vx, best_i), gap=v_end - t_end, **base)

    third = train[-max(n // 3, 2):]
    earlier = train[-2 * max(n // 3, 2): -max(n // 3, 2)] or train[: max(n // 3, 2)]
    gain = (_median(earlier) - _median(third)) / scale
    level = end / scale
    base.update(late_gain=round(gain, 4), level=round(level, 4))
    val_high = True
    if curves.val:
        v_end = _median([v for v in curves.val[-max(len(curves.val) // 3, 1):]])
        val_high = v_end / scale > STALL_LEVEL
        base["val_level"] = round(v_end / scale, 4)
    if gain < STALL_GAIN and level > STALL_LEVEL and val_high:
        vtext = f", validation {base['val_level']:.0%}" if curves.val else ""
        return _make("stalled-high", f"over the last third of {n} steps the loss improved by only {gain:.1%} of "
                     f"{_fmt(scale)} and stays at {level:.0%} of it{vtext}", **base)
    thirds = falls_unbounded(train)
    if thirds is not None:
        a, b, c = thirds
        return _make("unbounded", f"the loss is below zero and falls faster and faster: medians {_fmt(a)}, {_fmt(b)}, "
                     f"{_fmt(c)} over the three thirds of {n} steps (a loss bounded below slows down near its minimum)",
                     thirds=[a, b, c], **base)
    if gain < PLATEAU_GAIN:
        return _make("plateau", f"the loss {_went(start, end)} and levelled off (last third "
                     f"improved {gain:.1%})", **base)
    return _make("falling", f"the loss {_went(start, end)} and is still improving "
                 f"({gain:.1%} in the last third)", **base)


# -------------------------------------------------------------------------------------- sparkline
_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 60) -> str:
    """A one-line picture of a series; non-finite points show as '×'. Log scale when it spans > 100x."""
    if not values:
        return ""
    if len(values) > width:  # average into buckets, keeping a non-finite point visible
        out = []
        for b in range(width):
            chunk = values[b * len(values) // width: (b + 1) * len(values) // width] or [values[-1]]
            out.append(next((v for v in chunk if not _finite(v)), sum(chunk) / len(chunk)))
        values = out
    finite = [v for v in values if _finite(v)]
    if not finite:
        return "×" * len(values)
    use_log = min(finite) > 0 and max(finite) / min(finite) > 100
    tr = (lambda v: math.log10(v)) if use_log else (lambda v: v)
    lo, hi = tr(min(finite)), tr(max(finite))
    span = hi - lo or 1.0
    return "".join("×" if not _finite(v) else _BARS[min(7, int((tr(v) - lo) / span * 7.999))] for v in values)


# ------------------------------------------------------------------------------------------ logs
_STEP_KEYS = ("step", "global_step", "iteration", "iter", "it", "batch", "epoch", "steps", "x")
_VAL_WORDS = ("val", "valid", "validation", "eval", "dev", "test")


def _norm(key: str) -> str:
    return key.strip().lower().replace("/", "_").replace("-", "_").replace(" ", "_").replace(".", "_")


def pick_columns(keys: list[str]) -> dict[str, str]:
    """Which keys of a log hold the step, the train loss, the validation loss and accuracies."""
    found: dict[str, str] = {}
    normed = {k: _norm(k) for k in keys}
    for wanted in _STEP_KEYS:  # in order of preference: a step beats an epoch
        match = next((k for k, n in normed.items() if n == wanted), None)
        if match is not None:
            found["step"] = match
            break
    for k, n in normed.items():
        parts = set(n.split("_"))
        is_val = bool(parts & set(_VAL_WORDS))
        if "loss" in n or n in ("train", "training"):
            slot = "val" if is_val else "train"
        elif "acc" in n:
            slot = "val_acc" if is_val else "train_acc"
        else:
            continue
        # prefer the plainest name: 'loss' over 'loss_step_smoothed'
        if slot not in found or len(n) < len(normed[found[slot]]):
            found[slot] = k
    return found


def _num(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    if text == "":
        return None
    try:
        return float(text)
    except ValueError:
        low = text.lower()
        if low in ("nan", "-nan"):
            return math.nan
        if low in ("inf", "+inf", "infinity"):
            return math.inf
        if low in ("-inf", "-infinity"):
            return -math.inf
        return None


def _expand(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """watch.jsonl: a line's ``loss_between`` (``[[step, loss], ...]``, the steps between two lines) as rows of their
    own before it, so that the curve is the one the TensorBoard scalars of the same run hold."""
    if not any("loss_between" in r for r in rows):
        return rows
    out = []
    for r in rows:
        between = r.get("loss_between")
        if isinstance(between, list):
            out += [{"step": p[0], "loss": p[1]} for p in between if isinstance(p, list) and len(p) == 2]
        out.append({k: v for k, v in r.items() if k != "loss_between"})
    return out


def _from_rows(rows: list[dict[str, Any]], source: str) -> Curves:
    rows = _expand(rows)
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    cols = pick_columns(keys)
    if "train" not in cols and "val" not in cols:
        raise ValueError(f"{source}: no loss column among {keys} (expected e.g. step, loss, val_loss)")
    series: dict[str, tuple[list[float], list[float]]] = {s: ([], []) for s in ("train", "val", "train_acc", "val_acc")}
    for i, r in enumerate(rows):
        x = _num(r.get(cols["step"])) if "step" in cols else None
        x = float(i) if x is None else x
        for slot in series:
            if slot in cols:
                v = _num(r.get(cols[slot]))
                if v is not None:
                    series[slot][0].append(x)
                    series[slot][1].append(v)
    train_x, train = series["train"] if cols.get("train") else series["val"]
    curves = Curves(train=train, steps=train_x, source=source, columns=cols)
    if cols.get("train") and series["val"][1]:
        curves.val_steps, curves.val = series["val"]
    if series["train_acc"][1]:
        curves.train_acc = series["train_acc"][1]
    if series["val_acc"][1]:
        curves.val_acc = series["val_acc"][1]
    return curves


def _tensorboard(path: Path) -> Curves:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        raise ValueError(f"{path}: a TensorBoard event file; install 'tensorboard' to read it") from None
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
    acc.Reload()
    rows: dict[float, dict[str, float]] = {}
    for tag in acc.Tags().get("scalars", []):
        for event in acc.Scalars(tag):
            rows.setdefault(float(event.step), {"step": float(event.step)})[tag] = event.value
    if not rows:
        raise ValueError(f"{path}: no scalar summaries in this event file")
    return _from_rows([rows[k] for k in sorted(rows)], str(path))


def read_log(path: str | Path) -> Curves:
    """Read a CSV/TSV, JSON lines / JSON array, TensorBoard event file, or one number per line."""
    path = Path(path)
    if path.is_dir():
        events = sorted(path.rglob("events.out.tfevents.*"))
        if not events:
            raise ValueError(f"{path}: a folder without TensorBoard event files")
        return _tensorboard(events[-1])
    if "tfevents" in path.name:
        return _tensorboard(path)
    text = path.read_text(encoding="utf-8", errors="replace")
    stripped = text.strip()
    if not stripped:
        raise ValueError(f"{path}: empty file")
    if stripped[0] in "[{":
        try:
            data = json.loads(stripped)
            rows = data if isinstance(data, list) else [data]
        except json.JSONDecodeError:
            rows = [json.loads(line) for line in stripped.splitlines() if line.strip()]
        rows = [r for r in rows if isinstance(r, dict)]
        if len(rows) == 1 and any(isinstance(v, list) for v in rows[0].values()):  # {"loss": [...], ...}
            columns = {k: v for k, v in rows[0].items() if isinstance(v, list)}
            length = max(len(v) for v in columns.values())
            rows = [{k: (v[i] if i < len(v) else None) for k, v in columns.items()} for i in range(length)]
        return _from_rows(rows, str(path))
    lines = stripped.splitlines()
    if all(_num(line) is not None for line in lines):
        return Curves(train=[_num(line) for line in lines], source=str(path), columns={"train": "(values)"})
    dialect = "\t" if "\t" in lines[0] else ","
    reader = csv.DictReader(lines, delimiter=dialect)
    return _from_rows(list(reader), str(path))
