"""Data probes: look at the targets and inputs the user's loaders really produce.

- ``label-audit``: the targets' dtype, shape and range against what the configured loss needs, and
  the class balance; explains the crash (or, on CUDA, the device-side assert) a mismatch causes.
- ``input-stats``: per-feature / per-channel mean and standard deviation over a sample of the
  training inputs: values far from unit scale, non-finite entries, constant features.
- ``sample-dump``: five random (input, label) pairs, as a picture grid for images, a table for
  tabular rows, shape plus the first values for sequences.

Reading a whole data set goes through ``collect``: it draws at most ``max_samples`` items within a
time budget and says when it sampled, so the probes stay fast on large sets.
"""

from __future__ import annotations

import functools
import random
import time
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import IterableDataset, TensorDataset, default_collate

from nnwizard.probes.api import BarPlot, ImageGrid, ProbeContext, ProbeResult, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.target import BINARY_LOSSES, CLASSIFICATION_LOSSES, REGRESSION_LOSSES



# ------------------------------------------------------------------------------- reading data sets
@dataclass
class Samples:
    """Inputs and targets drawn from one split: ``indices`` into the dataset (None when read from the
    loader), ``total`` items in the split, ``sampled`` True when fewer than all were read."""

    x: torch.Tensor
    y: torch.Tensor
    indices: list[int] | None
    total: int | None
    sampled: bool
    seconds: float

    @property
    def n(self) -> int:
        return len(self.y)

    def describe(self) -> str:
        if self.sampled:
            of = f" of {self.total}" if self.total else ""
            return f"a random sample of {self.n}{of} samples"
        return f"all {self.n} samples"


def indexable(ds) -> bool:
    return ds is not None and not isinstance(ds, IterableDataset) and hasattr(ds, "__getitem__") and hasattr(ds, "__len__")


def first_two(item):
    if isinstance(item, dict):
        values = list(item.values())
        return values[0], values[1]
    return item[0], item[1]


class RaggedSamples(ValueError):
    """The split's samples are tensors of different shapes (sentences of different lengths): they do not
    make one tensor of samples."""


def ragged(exc: RaggedSamples) -> ProbeResult:
    """What a probe that reads the samples as one tensor says of a split whose samples differ in shape."""
    return skipped(f"the training samples differ in shape ({exc}): sequences of different lengths, not one "
                   f"tensor of samples to read", ragged=str(exc))


def reads_samples(audit):
    """For a probe that reads a split's samples as one tensor (``collect``): samples that differ in shape
    (RaggedSamples) end it as :func:`ragged`, a skip naming the shapes, not an errored probe."""
    @functools.wraps(audit)
    def run(ctx: ProbeContext):
        try:
            return audit(ctx)
        except RaggedSamples as exc:
            return ragged(exc)
    return run


def _stacked(parts: list, join) -> torch.Tensor:
    try:
        return join(parts)
    except RuntimeError as exc:
        shapes = sorted({tuple(torch.as_tensor(t).shape) for t in parts}, key=str)[:2]
        if len(shapes) > 1:
            raise RaggedSamples(f"{list(shapes[0])} and {list(shapes[1])}") from exc
        raise


def collect(target, split: str = "train", max_samples: int = 2048, budget_s: float = 1.0, seed: int = 0,
            ctx: ProbeContext | None = None) -> Samples | None:
    """Up to ``max_samples`` (input, target) pairs of a split, read from its dataset by index where
    possible (else from its loader), stopping at ``budget_s`` seconds or the probe's deadline.
    Raises RaggedSamples when the inputs (or targets) differ in shape from sample to sample."""
    loader = target.train_loader if split == "train" else target.val_loader
    if loader is None:
        return None
    started = time.monotonic()
    deadline = started + budget_s
    if ctx is not None and ctx.time_left() != float("inf"):
        deadline = min(deadline, time.monotonic() + max(0.2, ctx.time_left() * 0.5))
    ds = getattr(loader, "dataset", None)
    if indexable(ds):
        total = len(ds)
        order = list(range(total))
        if total > max_samples:
            order = sorted(random.Random(seed).sample(order, max_samples))
        if isinstance(ds, TensorDataset) and len(ds.tensors) >= 2:  # fast path: no per-item transform
            idx = torch.tensor(order, dtype=torch.long)
            return Samples(ds.tensors[0][idx], ds.tensors[1][idx], order, total, len(order) < total,
                           time.monotonic() - started)
        items, read = [], []
        for i in order:
            items.append(first_two(ds[i]))
            read.append(i)
            if len(read) % 64 == 0 and time.monotonic() > deadline:
                break
        if not items:
            return None
        x = _stacked([i[0] for i in items], default_collate)
        y = _stacked([i[1] for i in items], default_collate)
        return Samples(torch.as_tensor(x), torch.as_tensor(y), read, total, len(read) < total, time.monotonic() - started)
    xs, ys, complete = [], [], True
    for batch in loader:
        bx, by = first_two(batch)
        xs.append(torch.as_tensor(bx).cpu())
        ys.append(torch.as_tensor(by).cpu())
        if sum(len(b) for b in ys) >= max_samples or time.monotonic() > deadline:
            complete = False
            break
    if not xs:
        return None
    try:
        total = len(loader.dataset)  # type: ignore[arg-type]
    except Exception:
        total = None
    x, y = _stacked(xs, torch.cat)[:max_samples], _stacked(ys, torch.cat)[:max_samples]
    sampled = not complete or (total is not None and len(y) < total)
    return Samples(x, y, None, total, sampled, time.monotonic() - started)


def output_shape(ctx: ProbeContext) -> list[int] | None:
    """The model's output shape on the session's first batch (None when the forward raises)."""
    try:
        model = ctx.target.fresh_model(ctx.seed).eval()
        inputs, _ = ctx.target.batch()
        with torch.no_grad():
            out = model(inputs)
        return list(out.shape) if isinstance(out, torch.Tensor) else None
    except Exception:
        return None


def loss_kind(target) -> str:
    loss = target.loss_fn
    if isinstance(loss, CLASSIFICATION_LOSSES):
        return "class"
    if isinstance(loss, BINARY_LOSSES):
        return "binary"
    if isinstance(loss, REGRESSION_LOSSES):
        return "regression"
    return {"classification": "class", "binary": "binary"}.get(target.task, "regression")


def degenerate(y: torch.Tensor) -> str | None:
    """Why targets carry nothing to learn (every value the same), or None. Audits that compare
    predictions with targets skip on it: label-audit reports it as its own finding."""
    if y.numel() >= 2 and float(y.float().max() - y.float().min()) == 0.0:
        return f"every one of the {len(y)} targets read is {float(y.flatten()[0]):.4g} (majority-class rate 1.000)"
    return None


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


# ------------------------------------------------------------------------------------ label-audit
CUDA_NOTE = ("on CUDA the same check is a device-side assert ('Assertion `t >= 0 && t < n_classes` failed'), "
             "reported asynchronously at a later, unrelated line, after which every CUDA call fails; "
             "rerun on CPU or with CUDA_LAUNCH_BLOCKING=1 to see the real line")


@probe(
    "label-audit",
    title="Targets: dtype, shape and range against what the loss needs; class balance",
    outcomes={
        "ok": "targets fit the loss",
        "wrong-dtype": "the targets' dtype is not what the loss needs",
        "out-of-range": "target values outside what the loss accepts (class ids outside [0, C), BCE targets outside [0, 1])",
        "shape-mismatch": "targets have a shape the loss cannot pair with the outputs",
        "imbalanced": "targets fit, but the smallest class has under a tenth of the largest one's samples",
        "degenerate": "every target has the same value, or only one class occurs: nothing to learn",
    },
    timeout_s=30,
)
@reads_samples
def label_audit(ctx: ProbeContext):
    target = ctx.target
    samples = collect(target, "train", int(ctx.param("max_samples", 8192)), float(ctx.param("budget_s", 1.0)), ctx.seed, ctx)
    if samples is None:
        return cannot_run("no training targets could be read", reason="unreadable")
    y = samples.y
    kind = loss_kind(target)
    loss_name = type(target.loss_fn).__name__
    out = output_shape(ctx)
    n_classes = target.num_classes or (out[1] if (kind == "class" and out and len(out) >= 2) else None)
    data = dict(loss=loss_name, dtype=_dtype(y), target_shape=[samples.n, *y.shape[1:]], output_shape=out,
                num_classes=n_classes, read=samples.describe(), sampled=samples.sampled, n=samples.n)
    if y.numel():
        yf = y.float()
        data.update(min=float(yf.min()), max=float(yf.max()))
    per_sample = list(y.shape[1:])
    out_per_sample = out[1:] if out else None
    head = f"{samples.describe()} of the training targets: {data['dtype']} {data['target_shape']}"

    if kind == "class":
        ignore = getattr(target.loss_fn, "ignore_index", -100)
        if y.is_floating_point():
            if out_per_sample is not None and per_sample == out_per_sample and loss_name == "CrossEntropyLoss":
                rows = y.reshape(len(y), y.shape[1], -1) if y.dim() > 1 else y
                ok = bool(((y >= 0) & (y <= 1)).all()) and bool(((rows.sum(1) - 1).abs() < 1e-3).all())
                data["soft_labels"] = True
                if ok:
                    return passed(f"{head}: class probabilities (soft labels) of the output's shape", **data)
            integral = bool((y == y.round()).all())
            data["integral"] = integral
            what = "whole-number class ids stored as floats" if integral else "fractional values"
            return failed("wrong-dtype", f"{head}: {what}, but {loss_name} needs int64 (long) class indices of shape "
                          f"[N] for outputs {out}; the loss raises a dtype error (or, with a matching shape, "
                          f"reads them as probabilities)", **data)
        if y.dtype == torch.bool:
            return failed("wrong-dtype", f"{head}: bool targets, but {loss_name} needs int64 class indices", **data)
        if out is not None and len(out) >= 2 and y.dim() != len(out) - 1:
            return failed("shape-mismatch", f"{head}: {loss_name} with outputs {out} needs targets of shape "
                          f"{[out[0], *out[2:]]} (one class index per sample), got per-sample shape {per_sample}", **data)
        valid = y[y != ignore].long()
        if valid.numel() and n_classes:
            lo, hi = int(valid.min()), int(valid.max())
            bad = int(((valid < 0) | (valid >= n_classes)).sum())
            data.update(min=lo, max=hi, out_of_range=bad, ignore_index=ignore,
                        one_based=bool(lo >= 1 and hi == n_classes))
            if bad:
                why = (f"labels run 1..{hi}: they look 1-based; subtract 1" if data["one_based"]
                       else f"valid ids are 0..{n_classes - 1}")
                return failed("out-of-range", f"{head}: class ids span [{lo}, {hi}] but the model has {n_classes} "
                              f"outputs, so {bad} of {valid.numel()} targets lie outside [0, {n_classes}) ({why}). "
                              f"On CPU {loss_name} raises 'Target {hi} is out of bounds'; {CUDA_NOTE}", **data)
        counts = torch.bincount(valid.clamp_min(0), minlength=n_classes or 0).tolist() if valid.numel() else []
        present = [c for c in counts if c > 0]
        ratio = max(present) / min(present) if present else 1.0
        data.update(class_counts=counts, imbalance=round(ratio, 2), classes_seen=len(present),
                    missing_classes=[i for i, c in enumerate(counts) if c == 0])
        bars = [BarPlot("classes", "Class counts (training targets)", [str(i) for i in range(len(counts))],
                        [float(c) for c in counts], ylabel="samples")] if counts and len(counts) <= 100 else []
        if len(present) == 1 and samples.n >= 2:
            only = counts.index(present[0])
            return failed("degenerate", f"{head}: every one of the {valid.numel()} targets is class {only} "
                          f"(majority-class rate 1.000) although the model has {n_classes} outputs: a constant "
                          f"prediction scores perfectly, so nothing about the inputs is learned", bars, **data)
        text = (f"{head}: class ids in [{data['min']:.0f}, {data['max']:.0f}] for {n_classes} outputs; "
                f"largest/smallest class {ratio:.1f}x")
        # a 10x imbalance is where plain accuracy and an unweighted loss start to hide the rare class
        if ratio > 10:
            return passed(text, "imbalanced", bars, **data)
        return passed(text, artifacts=bars, **data)

    if kind == "binary":
        if not y.is_floating_point():
            return failed("wrong-dtype", f"{head}: {loss_name} needs float targets (0.0/1.0) of the output's "
                          f"shape {out}; integer targets make it raise a dtype error", **data)
        if out_per_sample is not None and per_sample != out_per_sample:
            return failed("shape-mismatch", f"{head}: {loss_name} needs targets of the output's shape {out}; "
                          f"per-sample target shape {per_sample} vs output {out_per_sample}", **data)
        outside = int(((y < 0) | (y > 1)).sum())
        data["out_of_range"] = outside
        if outside:
            return failed("out-of-range", f"{head}: {outside} targets outside [0, 1] (range [{data['min']:.3g}, "
                          f"{data['max']:.3g}]); {loss_name} needs probabilities in [0, 1], e.g. map {{-1, 1}} to {{0, 1}}", **data)
        pos = float((y > 0.5).float().mean())
        data["positive_fraction"] = round(pos, 4)
        if samples.n >= 2 and float(yf.max() - yf.min()) == 0.0:
            return failed("degenerate", f"{head}: every one of the {samples.n} targets is {data['min']:.3g} "
                          f"(majority-class rate 1.000): a constant prediction scores perfectly", **data)
        text = f"{head}: values in [{data['min']:.3g}, {data['max']:.3g}], {pos:.1%} positive"
        if 0 < pos < 1 and max(pos, 1 - pos) / min(pos, 1 - pos) > 10:
            return passed(text, "imbalanced", **data)
        return passed(text, **data)

    # regression
    if not y.is_floating_point():
        return failed("wrong-dtype", f"{head}: {loss_name} needs floating-point targets; integer targets make "
                      f"the backward pass raise a dtype error", **data)
    if out_per_sample is not None and per_sample != out_per_sample:
        return failed("shape-mismatch", f"{head}: per-sample target shape {per_sample} vs output "
                      f"{out_per_sample}: {loss_name} broadcasts them instead of pairing one prediction with one target", **data)
    if samples.n >= 2 and y.numel() and float(y.float().max() - y.float().min()) == 0.0:
        return failed("degenerate", f"{head}: every one of the {samples.n} targets is {data['min']:.4g} (variance 0): "
                      f"a constant output reaches zero loss, so nothing about the inputs is learned", **data)
    return passed(f"{head}: range [{data.get('min', 0):.3g}, {data.get('max', 0):.3g}], shapes fit", **data)


# ------------------------------------------------------------------------------------ input-stats
def feature_axis(x: torch.Tensor) -> int:
    """Which axis of a batch holds the features/channels: 1 for (N, F) and images (N, C, ...),
    the last one for sequences (N, T, F)."""
    if x.dim() <= 2:
        return 1
    if x.dim() == 3:  # (N, T, F) sequence or (N, C, L) signal: the smaller trailing axis is the feature one
        return 2 if x.shape[2] <= x.shape[1] else 1
    return 1


def per_feature(x: torch.Tensor):
    """(axis, mean, std, min, max, non-finite count) per feature over the finite values, in float64
    but a million values at a time: whole-dataset float64 temporaries would cost more than the model."""
    axis = feature_axis(x)
    flat = x.movedim(axis, -1).reshape(-1, x.shape[axis])
    rows = max(1, (1 << 20) // max(flat.shape[1], 1))
    width = flat.shape[1]
    count = torch.zeros(width, dtype=torch.float64)
    total = torch.zeros(width, dtype=torch.float64)
    lo = torch.full((width,), float("inf"), dtype=torch.float64)
    hi = torch.full((width,), float("-inf"), dtype=torch.float64)
    for i in range(0, len(flat), rows):
        part = flat[i:i + rows].double()
        finite = torch.isfinite(part)
        count += finite.sum(0)
        total += torch.where(finite, part, 0.0).sum(0)
        lo = torch.minimum(lo, torch.where(finite, part, float("inf")).min(0).values)
        hi = torch.maximum(hi, torch.where(finite, part, float("-inf")).max(0).values)
    mean = total / count.clamp_min(1)
    var = torch.zeros(width, dtype=torch.float64)
    for i in range(0, len(flat), rows):
        part = flat[i:i + rows].double()
        var += torch.where(torch.isfinite(part), part - mean, 0.0).pow(2).sum(0)
    var /= count.clamp_min(1)
    nonfinite = (len(flat) - count).long()
    return axis, mean, var.sqrt(), lo, hi, nonfinite


# Default PyTorch layers (kaiming-uniform, a=sqrt(5)) keep unit-scale inputs at unit scale. A feature
# whose root-mean-square is above 20 multiplies the first layer's pre-activations by that factor:
# saturated or exploding activations and an ill-conditioned loss. Features on a 0..16 or 0..10 scale
# still train fine, raw 0..255 pixels or values in the thousands do not.
RMS_LIMIT = 20.0


@probe(
    "input-stats",
    title="Per-feature / per-channel mean and std of the training inputs",
    outcomes={"ok": "inputs near unit scale", "unnormalized": "some features are far beyond unit scale",
              "non-finite": "inputs hold NaN or Inf", "constant": "inputs near unit scale, some features are constant"},
    timeout_s=30,
)
@reads_samples
def input_stats(ctx: ProbeContext):
    samples = collect(ctx.target, "train", int(ctx.param("max_samples", 4096)), float(ctx.param("budget_s", 1.0)), ctx.seed, ctx)
    if samples is None:
        return cannot_run("no training inputs could be read", reason="unreadable")
    x = samples.x
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return skipped(f"inputs are {getattr(x, 'dtype', type(x).__name__)} (indices or tokens): scale does not apply",
                       dtype=str(getattr(x, "dtype", "")))
    axis, mean, std, lo, hi, nonfinite = per_feature(x)
    rms = (mean ** 2 + std ** 2).sqrt()
    label = "channel" if (x.dim() >= 4 or (x.dim() == 3 and axis == 1)) else "feature"
    nf = int(nonfinite.sum())
    worst = int(rms.argmax())
    constant = [int(i) for i in torch.nonzero(std == 0).flatten().tolist()]
    flagged = [int(i) for i in torch.nonzero(rms > RMS_LIMIT).flatten().tolist()]
    data = dict(read=samples.describe(), sampled=samples.sampled, n=samples.n, axis=axis, groups=int(len(mean)), kind=label,
                max_rms=float(rms.max()), worst=worst, worst_mean=float(mean[worst]), worst_std=float(std[worst]),
                worst_min=float(lo[worst]), worst_max=float(hi[worst]), flagged=len(flagged), flagged_ids=flagged[:20],
                constant=len(constant), constant_ids=constant[:20], nonfinite=nf,
                mean_abs_mean=float(mean.abs().mean()), mean_std=float(std.mean()),
                global_min=float(lo.min()), global_max=float(hi.max()))
    order = sorted(range(len(mean)), key=lambda i: -float(rms[i]))[:10]
    rows = [[f"{label} {i}", f"{float(mean[i]):.4g}", f"{float(std[i]):.4g}", f"{float(lo[i]):.4g}", f"{float(hi[i]):.4g}",
             int(nonfinite[i])] for i in order]
    table = Table("input-stats", f"Training inputs per {label} (largest scale first, {samples.describe()})",
                  [label, "mean", "std", "min", "max", "non-finite"], rows,
                  marked=[r for r, i in enumerate(order) if float(rms[i]) > RMS_LIMIT or int(nonfinite[i])])
    head = f"{samples.describe()}, {len(mean)} {label}s"
    if nf:
        bad = [int(i) for i in torch.nonzero(nonfinite).flatten().tolist()]
        data["nonfinite_ids"] = bad[:20]
        return failed("non-finite", f"{head}: {nf} non-finite input values in {label}s {bad[:8]}", [table], **data)
    if flagged:
        return failed("unnormalized", f"{head}: {len(flagged)} {label}s beyond unit scale; {label} {worst} has mean "
                      f"{data['worst_mean']:.4g}, std {data['worst_std']:.4g}, range [{data['worst_min']:.4g}, "
                      f"{data['worst_max']:.4g}] (root-mean-square {data['max_rms']:.3g} > {RMS_LIMIT:g})", [table], **data)
    text = f"{head}: largest root-mean-square {data['max_rms']:.3g} ({label} {worst}), mean |mean| {data['mean_abs_mean']:.3g}, mean std {data['mean_std']:.3g}"
    if constant:
        return passed(f"{text}; {len(constant)} constant {label}s {constant[:8]}", "constant", [table], **data)
    return passed(text, artifacts=[table], **data)


# ------------------------------------------------------------------------------------ sample-dump
def _has_conv(model: nn.Module, cls) -> bool:
    return any(isinstance(m, cls) for m in model.modules())


def _label(y) -> str:
    if isinstance(y, torch.Tensor):
        if y.numel() == 1:
            v = y.item()
            return (f"{v:.1f}" if v == int(v) else f"{v:.4g}") if isinstance(v, float) else str(v)
        return f"{_dtype(y)}{list(y.shape)}"
    return str(y)


@probe(
    "sample-dump",
    title="Five random training samples with their labels",
    outcomes={"ok": "samples shown"},
    timeout_s=30,
)
@reads_samples
def sample_dump(ctx: ProbeContext):
    target = ctx.target
    count = int(ctx.param("count", 5))
    samples = collect(target, "train", 4096, 0.5, ctx.seed, ctx)
    if samples is None or samples.n == 0:
        return cannot_run("no training samples could be read", reason="unreadable")
    rng = random.Random(ctx.seed)
    picks = sorted(rng.sample(range(samples.n), min(count, samples.n)))
    ids = [samples.indices[p] if samples.indices else p for p in picks]
    x0 = samples.x[picks[0]]
    model = target.fresh_model(ctx.seed)
    conv2d = _has_conv(model, nn.Conv2d)
    is_float = x0.is_floating_point()
    if is_float and ((x0.dim() == 3 and (x0.shape[0] in (1, 3) or conv2d) and min(x0.shape[1:]) >= 4)
                     or (x0.dim() == 2 and conv2d and min(x0.shape) >= 4)):
        layout = "image"
    elif is_float and x0.dim() == 1:
        layout = "tabular"
    else:
        layout = "sequence"
    labels = [_label(samples.y[p]) for p in picks]
    data = dict(layout=layout, sample_shape=list(x0.shape), dtype=_dtype(x0), indices=ids, labels=labels,
                read=samples.describe())
    summary = f"{len(picks)} {layout} samples of shape {list(x0.shape)} ({data['dtype']}): " + ", ".join(
        f"#{i} -> {lab}" for i, lab in zip(ids, labels))
    if layout == "image":
        images = []
        for p in picks:
            t = samples.x[p].detach().float().cpu()
            if t.dim() == 3 and t.shape[0] not in (1, 3):
                t = t[0]
            if t.dim() == 3:
                t = t[0] if t.shape[0] == 1 else t.permute(1, 2, 0)
            t = torch.nan_to_num(t)
            lo, hi = float(t.min()), float(t.max())
            t = (t - lo) / (hi - lo) if hi > lo else torch.zeros_like(t)
            images.append(t.tolist())
        grid = ImageGrid("samples", "Random training samples (label above each; each image scaled to its own range)",
                         images, [f"#{i}: label {lab}" for i, lab in zip(ids, labels)])
        return passed(summary, artifacts=[grid], **data)
    if layout == "tabular":
        width = min(10, x0.shape[0])
        cols = ["index", "label", *[f"x{j}" for j in range(width)]] + (["..."] if x0.shape[0] > width else [])
        rows = [[i, lab, *[f"{float(v):.4g}" for v in samples.x[p][:width]]] + (["..."] if x0.shape[0] > width else [])
                for i, lab, p in zip(ids, labels, picks)]
        return passed(summary, artifacts=[Table("samples", f"Random training rows ({x0.shape[0]} features)", cols, rows)], **data)
    rows = []
    for i, lab, p in zip(ids, labels, picks):
        flat = samples.x[p].reshape(-1)[:8].tolist()
        head = ", ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in flat)
        rows.append([i, lab, list(samples.x[p].shape), f"[{head}, ...]"])
    return passed(summary, artifacts=[Table("samples", "Random training sequences (shape and first values)",
                                            ["index", "label", "shape", "head"], rows)], **data)
