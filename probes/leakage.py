"""Leakage and pipeline probes: what the validation numbers can be trusted for.

- ``leakage-audit``: validation samples that also occur in the training set, exactly (hash of the
  input bytes) or nearly (for images also flipped or shifted by a pixel), compared with how often
  training samples repeat among themselves, so data with legitimately similar samples stays quiet.
- ``label-leak-audit``: one input column that alone predicts the target almost perfectly.
- ``pipeline-audit``: random transforms in the validation dataset (the same index read twice gives
  different tensors), a shuffling validation loader, an unshuffled training loader whose batches are
  grouped by label.
- ``label-signal-audit``: whether the labels carry any signal about the inputs at all (nearest
  neighbours and class centroids against a permuted-label baseline): labels misaligned with inputs.

All reads go through ``data.collect`` (budgeted; says when it sampled).
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import RandomSampler, SequentialSampler, TensorDataset

from nnwizard.probes.api import ImageGrid, ProbeContext, Table, failed, passed, probe, skipped
from nnwizard.probes.data import Samples, first_two, indexable, collect, degenerate, loss_kind, reads_samples


def _flat(x: torch.Tensor, max_dim: int = 1024) -> torch.Tensor:
    """Float vectors, images average-pooled so that a sample has at most ``max_dim`` values."""
    x = x.detach().float().cpu()
    if x.dim() == 4 and x[0].numel() > max_dim:
        c, h, w = x.shape[1:]
        side = max(1, int(math.sqrt(max_dim / c)))
        x = F.adaptive_avg_pool2d(x, (min(h, side), min(w, side)))
    x = x.reshape(len(x), -1)
    return torch.nan_to_num(x)


def _hashes(x: torch.Tensor) -> list[str]:
    arr = x.detach().cpu().contiguous().numpy()
    return [hashlib.blake2b(row.tobytes(), digest_size=12).hexdigest() for row in arr.reshape(len(arr), -1)]


# --------------------------------------------------------------------------------- leakage-audit
# A validation sample is a near duplicate of a training one when the two differ by less than a tenth
# of a typical sample's size (L2 distance of mean-centred vectors / their root-mean-square norm):
# an augmented copy (noise, a flip, a one-pixel shift), not merely a sample of the same class.
NEAR = 0.1


def _variants(x: torch.Tensor):
    """(name, train-side crop, val-side crop) for images: identity, horizontal flip, 1-pixel shifts."""
    yield "same", (lambda t: t), (lambda t: t)
    if x.dim() == 4 and min(x.shape[2:]) >= 8:
        yield "flipped", (lambda t: t), (lambda t: t.flip(-1))
        for dy, dx in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            def a(t, dy=dy, dx=dx):
                h, w = t.shape[2:]
                return t[:, :, max(dy, 0):h + min(dy, 0), max(dx, 0):w + min(dx, 0)]

            def b(t, dy=dy, dx=dx):
                h, w = t.shape[2:]
                return t[:, :, max(-dy, 0):h + min(-dy, 0), max(-dx, 0):w + min(-dx, 0)]
            yield f"shifted ({dy:+d},{dx:+d})", a, b


def _nearest(ref: torch.Tensor, query: torch.Tensor, deadline: float):
    """Relative distance from each query row to its nearest reference row, and that row."""
    mu = ref.mean(0, keepdim=True)
    ref_c, query_c = ref - mu, query - mu
    scale = ref_c.pow(2).sum(1).mean().sqrt().clamp_min(1e-12)
    best = torch.full((len(query),), float("inf"))
    arg = torch.zeros(len(query), dtype=torch.long)
    done = 0
    for start in range(0, len(query), 512):
        d = torch.cdist(query_c[start:start + 512], ref_c)
        v, i = d.min(1)
        best[start:start + 512], arg[start:start + 512] = v / scale, i
        done = start + 512
        if time.monotonic() > deadline:
            break
    return best[:done], arg[:done]


def _near_rate(ref_x: torch.Tensor, query_x: torch.Tensor, deadline: float):
    """Per query sample: smallest relative distance over all variants, the train row and variant."""
    best = torch.full((len(query_x),), float("inf"))
    arg = torch.zeros(len(query_x), dtype=torch.long)
    how = ["same"] * len(query_x)
    for name, a, b in _variants(ref_x):
        d, i = _nearest(_flat(a(ref_x)), _flat(b(query_x)), deadline)
        k = len(d)
        better = d < best[:k]
        for j in torch.nonzero(better).flatten().tolist():
            how[j] = name
        best[:k] = torch.where(better, d, best[:k])
        arg[:k] = torch.where(better, i, arg[:k])
        if time.monotonic() > deadline:
            break
    return best, arg, how


def _to_image(t: torch.Tensor):
    t = t.detach().float().cpu()
    if t.dim() == 3:
        t = t[0] if t.shape[0] != 3 else t.permute(1, 2, 0)
    lo, hi = float(t.min()), float(t.max())
    return ((t - lo) / (hi - lo) if hi > lo else torch.zeros_like(t)).tolist()


@probe(
    "leakage-audit",
    title="Validation samples that also occur in the training set (exact and near duplicates)",
    outcomes={"ok": "no more overlap than training samples have among themselves",
              "leak": "validation samples duplicate training samples far more often than training samples repeat",
              "no-val": "no validation set"},
    timeout_s=60,
)
@reads_samples
def leakage_audit(ctx: ProbeContext):
    target = ctx.target
    if target.val_loader is None:
        return skipped("no validation set to compare", "no-val")
    budget = float(ctx.param("budget_s", 2.0))
    started = time.monotonic()
    train = collect(target, "train", int(ctx.param("max_train", 4096)), budget / 3, ctx.seed, ctx)
    val = collect(target, "val", int(ctx.param("max_val", 1024)), budget / 3, ctx.seed + 1, ctx)
    if train is None or val is None or not isinstance(train.x, torch.Tensor) or train.x[0].shape != val.x[0].shape:
        return skipped("training and validation inputs could not be read as tensors of one shape")
    # exact: hash of the input bytes
    train_hash = _hashes(train.x)
    where = {}
    for i, h in enumerate(train_hash):
        where.setdefault(h, i)
    val_hash = _hashes(val.x)
    exact = [j for j, h in enumerate(val_hash) if h in where]
    train_internal_exact = len(train_hash) - len(where)
    # Categorical inputs (integer token ids, class codes): a distance between id sequences means
    # nothing, so only exact copies count, against the rate of exact copies within the training set.
    categorical = not train.x.is_floating_point()
    deadline = started + budget
    half = train.n // 2
    if categorical:
        checked = val.n
        dist = torch.where(torch.tensor([h in where for h in val_hash]), 0.0, float("inf"))
        arg = torch.tensor([where.get(h, 0) for h in val_hash])
        how = ["same"] * checked
        near = []
        second = set(train_hash[:half])
        base_rate = sum(h in second for h in train_hash[half:]) / max(train.n - half, 1) if half >= 8 else 0.0
    else:
        # near: relative distance to the nearest training sample (images: also flipped / shifted)
        dist, arg, how = _near_rate(train.x, val.x, deadline)
        checked = len(dist)
        near = [j for j in range(checked) if dist[j] < NEAR]
        # baseline: the same measurement between two halves of the training sample
        base_d, _, _ = _near_rate(train.x[:half], train.x[half:], deadline) if half >= 8 else (torch.tensor([]), None, None)
        base_rate = float((base_d < NEAR).float().mean()) if len(base_d) else 0.0
    val_rate = len(set(near) | set(exact)) / max(checked, 1)
    sampled = train.sampled or val.sampled or checked < val.n
    tidx = lambda k: train.indices[k] if train.indices else k  # noqa: E731
    vidx = lambda k: val.indices[k] if val.indices else k  # noqa: E731
    examples = [[vidx(j), tidx(int(arg[j])), f"{float(dist[j]):.3f}", how[j], "yes" if j in set(exact) else "no"]
                for j in sorted(set(near) | set(exact), key=lambda j: float(dist[j]))[:8]]
    data = dict(train_read=train.describe(), val_read=val.describe(), sampled=sampled, checked=checked,
                exact=len(exact), near=len(near), val_rate=round(val_rate, 4), train_internal_rate=round(base_rate, 4),
                train_internal_exact=train_internal_exact, threshold=NEAR,
                median_distance=float(dist.median()) if checked else None,
                pairs=[e[:2] for e in examples], seconds=round(time.monotonic() - started, 3))
    note = " (sampled: not every sample was compared)" if sampled else ""
    table = Table("leaks", "Validation samples with a training duplicate (closest first)",
                  ["val index", "train index", "relative distance", "match", "exact"], examples,
                  marked=list(range(len(examples))))
    if categorical:
        text = (f"{len(exact)} exact copies among {checked} validation samples checked against {train.describe()}{note} "
                f"(categorical {str(train.x.dtype).replace('torch.', '')} inputs: only exact copies count): {val_rate:.1%} "
                f"of validation vs {base_rate:.1%} between two halves of the training set")
    else:
        text = (f"{len(exact)} exact and {len(near)} near duplicates (relative distance < {NEAR}) among {checked} "
                f"validation samples checked against {train.describe()}{note}: {val_rate:.1%} of validation vs "
                f"{base_rate:.1%} between two halves of the training set")
    # Leakage when at least 3 validation samples (5%) have a training twin. For continuous inputs a twin
    # closer than a tenth of a sample's size is a copy (augmented or repeated record), whether or not
    # the training set holds copies too (then any random split leaks). Only where every column takes
    # few values (<= 16: one-hot, binary, small categorical tables) are identical rows expected by
    # chance; there the validation rate must also be well above (3x + 2 points) the rate between two
    # halves of the training set. The same holds for dense low-dimensional inputs (<= 6 features):
    # nearest-neighbour distances shrink like n^(-1/d), so with a few hundred samples in 2-4 dimensions
    # independent samples fall within a tenth of each other's size by chance, in both comparisons alike.
    flat_train = _flat(train.x, max_dim=10**9)
    distinct = max((len(torch.unique(flat_train[:, j])) for j in range(min(flat_train.shape[1], 256))), default=0)
    discrete = distinct <= 16
    low_dim = flat_train.shape[1] <= 6
    data.update(discrete=discrete, max_distinct_per_column=distinct, low_dim=low_dim, categorical=categorical)
    if base_rate > 0.05:
        copies = "exact copies" if categorical else "copies (exact or near)"
        text += f"; the training set holds {copies} of its own samples, so any random split leaks"
    # twins that are transformed copies (noise, a flip, a shift: near, not byte-identical), with such copies inside
    # the training set too: every sample was augmented into several before the data was split
    transformed = [j for j in near if j not in set(exact)]
    geometric = any(how[j] != "same" for j in transformed)   # a flipped or shifted twin is an augmented copy by itself
    augmented = (not categorical and len(transformed) >= 3 and len(transformed) >= len(set(near) | set(exact)) / 2
                 and (base_rate > 0.05 or geometric))
    data["augmented_before_split"] = augmented
    if augmented:
        kinds = sorted({how[j] if how[j] != "same" else "noise" for j in transformed})
        own = ", as the training set holds of its own samples" if base_rate > 0.05 else ""
        text += (f"; {len(transformed)} of the twins are transformed copies ({', '.join(kinds)}){own}: the data was "
                 f"augmented before it was split into training and validation, so augmented copies of one sample sit "
                 f"on both sides")
    above_chance = val_rate > 3 * base_rate + 0.02
    exact_copies = len(exact) >= 3 and len(exact) / max(checked, 1) >= 0.05  # byte-identical floats are no accident
    if categorical:
        leaks = exact_copies
    elif discrete:
        leaks = above_chance
    elif low_dim:
        leaks = exact_copies or above_chance
    else:
        leaks = True
    if len(set(near) | set(exact)) >= 3 and val_rate >= 0.05 and leaks:
        artifacts = [table]
        if train.x.dim() == 4 and examples:
            imgs, caps = [], []
            for vj, ti, d, m, _ in examples[:3]:
                j = val.indices.index(vj) if val.indices else vj
                k = train.indices.index(ti) if train.indices else ti
                imgs += [_to_image(val.x[j]), _to_image(train.x[k])]
                caps += [f"val #{vj}", f"train #{ti} ({m})"]
            artifacts.append(ImageGrid("leak-pairs", "Validation samples next to their training twins", imgs, caps))
        return failed("leak", text, artifacts, **data)
    return passed(text, artifacts=[table] if examples else [], **data)


# ------------------------------------------------------------------------------ label-leak-audit
def _columns(x: torch.Tensor, limit: int, seed: int):
    flat = _flat(x, max_dim=10**9)
    d = flat.shape[1]
    cols = list(range(d))
    if d > limit:
        cols = sorted(random.Random(seed).sample(cols, limit))
    return flat[:, cols], cols, d


def _column_quantiles(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``torch.quantile(x, q, dim=0).T`` to the bit (the same ranks and interpolation), from one sort of
    the contiguous transpose, about three times faster on a few thousand columns."""
    ordered = x.T.contiguous().sort(1).values
    ranks = q.to(x.dtype) * (x.shape[0] - 1)
    below, above = ranks.floor().long(), ranks.ceil().long()
    return torch.lerp(ordered[:, below], ordered[:, above], ranks - ranks.floor())


def _binned(train_x, train_y, test_x, bins: int, classes: int | None):
    """Per column: bin by training quantiles, predict each bin's majority class (or mean target)."""
    edges = _column_quantiles(train_x, torch.linspace(0, 1, bins + 1)[1:-1])  # (d, bins-1)
    tb = torch.searchsorted(edges, train_x.T.contiguous(), right=True)  # (d, n)
    vb = torch.searchsorted(edges, test_x.T.contiguous(), right=True)
    d = train_x.shape[1]
    if classes:
        idx = tb * classes + train_y.long().unsqueeze(0)
        counts = torch.zeros(d, bins * classes).scatter_add_(1, idx, torch.ones_like(idx, dtype=torch.float))
        majority = counts.view(d, bins, classes).argmax(-1)
        return majority.gather(1, vb)  # (d, m) predicted classes
    sums = torch.zeros(d, bins).scatter_add_(1, tb, train_y.float().unsqueeze(0).expand(d, -1).contiguous())
    cnt = torch.zeros(d, bins).scatter_add_(1, tb, torch.ones_like(tb, dtype=torch.float))
    means = torch.where(cnt > 0, sums / cnt.clamp_min(1), train_y.float().mean())
    return means.gather(1, vb)


def _split(target, ctx, max_train=4096, max_val=2048):
    train = collect(target, "train", max_train, 0.7, ctx.seed, ctx)
    val = collect(target, "val", max_val, 0.5, ctx.seed + 1, ctx) if target.val_loader is not None else None
    if train is None:
        return None, None, "none"
    if val is None or val.x[0].shape != train.x[0].shape:
        half = train.n // 2
        a = Samples(train.x[:half], train.y[:half], None, train.total, True, 0.0)
        b = Samples(train.x[half:], train.y[half:], None, train.total, True, 0.0)
        return a, b, "two halves of the training set"
    return train, val, "training -> validation"


# A single column that predicts the class of 99.5% of held-out samples (at most one miss in 200, and
# covering at least half of the gap between the majority-class rate and 100%), or explains 99.5% of a
# regression target's variance, is a copy of the target, not a feature. Between 98% and 99.5% it is
# reported as a strong column: cleanly separable data (two well-apart clusters) can get there honestly.
LEAK_SCORE = 0.995
STRONG_SCORE = 0.98


@probe(
    "label-leak-audit",
    title="An input column that alone predicts the target almost perfectly",
    outcomes={"ok": "no single column predicts the target", "leak": "one column alone predicts the target",
              "strong-column": "one column alone predicts the target nearly (98-99.5%): a hint, not proof",
              "no-targets": "targets cannot be scored per column"},
    timeout_s=60,
)
@reads_samples
def label_leak_audit(ctx: ProbeContext):
    target = ctx.target
    fit, test, how = _split(target, ctx)
    if fit is None or fit.n < 20 or not isinstance(fit.x, torch.Tensor):
        return skipped("too few samples to score columns")
    kind = loss_kind(target)
    y_fit, y_test = fit.y, test.y
    flat = degenerate(torch.cat([y_fit.reshape(-1), y_test.reshape(-1)]))
    if flat:
        return skipped(f"{flat}: no column can predict more than a constant does (see label-audit)", "no-targets")
    if y_fit.dim() > 1:
        if y_fit[0].numel() != 1:
            return skipped("multi-value targets: columns are not scored", "no-targets")
        y_fit, y_test = y_fit.reshape(-1), y_test.reshape(-1)
    xf, cols, total_cols = _columns(fit.x, int(ctx.param("max_columns", 2048)), ctx.seed)
    xt = _flat(test.x, max_dim=10**9)[:, cols]
    integral = not y_fit.is_floating_point() or bool((y_fit == y_fit.round()).all())
    classes = None
    if kind in ("class", "binary") and integral and y_fit.min() >= 0 and y_fit.max() < 1000:
        classes = int(max(y_fit.max(), y_test.max())) + 1
    if classes:
        pred = _binned(xf, y_fit, xt, 32, classes)
        scores = (pred == y_test.long().unsqueeze(0)).float().mean(1)
        counts = torch.bincount(y_test.long(), minlength=classes).float()
        chance = float(counts.max() / counts.sum())
        metric = "accuracy"
    elif kind == "binary":  # soft targets: threshold at 0.5
        pred = _binned(xf, (y_fit > 0.5).long(), xt, 32, 2)
        scores = (pred == (y_test > 0.5).long().unsqueeze(0)).float().mean(1)
        chance = max(float((y_test > 0.5).float().mean()), 1 - float((y_test > 0.5).float().mean()))
        metric = "accuracy"
    else:
        pred = _binned(xf, y_fit.float(), xt, 32, None)
        resid = ((pred - y_test.float().unsqueeze(0)) ** 2).mean(1)
        var = y_test.float().var(unbiased=False).clamp_min(1e-12)
        scores = 1 - resid / var
        chance = 0.0
        metric = "R^2"
    best = int(scores.argmax())
    score = float(scores[best])
    top = scores.topk(min(5, len(scores)))
    rows = [[f"column {cols[int(i)]}", f"{float(v):.3f}"] for v, i in zip(top.values, top.indices)]
    sampled = fit.sampled or (test.sampled if test else False) or total_cols > len(cols)
    data = dict(column=cols[best], score=round(score, 4), metric=metric, chance=round(chance, 4), how=how,
                columns=total_cols, scored_columns=len(cols), sampled=sampled, n_fit=fit.n, n_test=test.n)
    note = f" ({len(cols)} of {total_cols} columns scored)" if total_cols > len(cols) else ""
    text = (f"best single column {cols[best]} reaches {metric} {score:.3f} alone ({how}, {test.n} held-out samples; "
            f"majority-class rate {chance:.3f}){note}" if metric == "accuracy" else
            f"best single column {cols[best]} explains {metric} {score:.3f} of the target alone ({how}, {test.n} held-out samples){note}")
    table = Table("columns", f"Columns that best predict the target alone ({metric})", ["column", metric], rows,
                  marked=[0] if score >= STRONG_SCORE else [])
    if score - chance >= 0.5 * (1 - chance):
        if score >= LEAK_SCORE:
            return failed("leak", text, [table], **data)
        if score >= STRONG_SCORE:
            return passed(text, "strong-column", [table], **data)
    return passed(text, artifacts=[table], **data)


# -------------------------------------------------------------------------------- pipeline-audit
def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _read_twice(ds, indices: list[int]):
    """Read each index twice under different seeds; count the items whose input tensors differ."""
    differ, biggest, pairs = 0, 0.0, []
    for i in indices:
        _seed_all(1)
        a = first_two(ds[i])[0]
        _seed_all(2)
        b = first_two(ds[i])[0]
        a, b = torch.as_tensor(a).float(), torch.as_tensor(b).float()
        if a.shape != b.shape or not torch.equal(a, b):
            differ += 1
            delta = float((a - b).abs().max()) if a.shape == b.shape else float("inf")
            biggest = max(biggest, delta)
            if len(pairs) < 2:
                pairs.append((i, a, b))
    return differ, biggest, pairs


def _sampler_shuffles(loader) -> bool | None:
    sampler = getattr(loader, "sampler", None)
    if isinstance(sampler, RandomSampler):
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    try:
        first, second = list(itertools.islice(iter(sampler), 256)), list(itertools.islice(iter(sampler), 256))
        return first != second
    except Exception:
        return None


def _batch_targets(loader, max_batches: int, deadline: float) -> list[torch.Tensor]:
    """Targets of batches spread over a sequential loader: read from the dataset by index where possible."""
    ds = getattr(loader, "dataset", None)
    bs = getattr(loader, "batch_size", None)
    if indexable(ds) and bs and isinstance(getattr(loader, "sampler", None), SequentialSampler):
        n = len(ds)
        nb = math.ceil(n / bs)
        picks = sorted(set(np.linspace(0, nb - 1, min(nb, max_batches)).round().astype(int).tolist()))
        out = []
        for b in picks:
            idx = list(range(b * bs, min(n, (b + 1) * bs)))
            if isinstance(ds, TensorDataset):
                out.append(ds.tensors[1][idx])
            else:
                out.append(torch.stack([torch.as_tensor(first_two(ds[i])[1]) for i in idx]))
            if time.monotonic() > deadline:
                break
        return out
    out = []
    for batch in loader:
        out.append(torch.as_tensor(first_two(batch)[1]).cpu())
        if len(out) >= max_batches or time.monotonic() > deadline:
            break
    return out


def _between_batch_share(batches: list[torch.Tensor], classes: bool) -> float | None:
    """Share of the targets' variance that lies between batches (eta squared); about 1/batch size when
    batches are random draws, near 1 when each batch holds one label."""
    batches = [b for b in batches if len(b)]
    if len(batches) < 2:
        return None
    if classes:
        allv = torch.cat([b.reshape(-1) for b in batches]).long()
        k = int(allv.max()) + 1 if allv.numel() else 1
        if k > 1000 or allv.min() < 0:
            return None
        enc = [F.one_hot(b.reshape(-1).long(), k).float() for b in batches]
    else:
        enc = [b.reshape(len(b), -1).float() for b in batches]
    allv = torch.cat(enc)
    total = ((allv - allv.mean(0)) ** 2).sum()
    if total <= 0:
        return None
    between = sum(len(e) * ((e.mean(0) - allv.mean(0)) ** 2).sum() for e in enc)
    return float(between / total)


SHUFFLE_EFFECT = 1e-4  # relative change of a reported metric between two evaluations of one model
SHUFFLE_MAX_BATCHES = 32


def _shuffle_effect(target, ctx) -> dict:
    """Evaluate one fresh model (eval mode) twice through the user's evaluate (else the reference)
    on the real, shuffling validation loader: does the reported number change with the order?"""
    loader = target.loader("val")
    if loader is None or len(loader) > SHUFFLE_MAX_BATCHES:
        return {}
    model = target.fresh_model(ctx.seed).eval()
    try:
        first, second = target.evaluate(model, loader), target.evaluate(model, loader)
    except Exception:  # noqa: BLE001 - evaluate raising is metric-audit's and training-crash's finding
        return {}
    keys = [k for k in first if k in second and math.isfinite(first[k]) and math.isfinite(second[k])]
    if not keys:
        return {}
    change = {k: abs(first[k] - second[k]) / max(abs(first[k]), 1e-12) for k in keys}
    key = max(keys, key=lambda k: change[k])
    return dict(val_metric=key, val_first=first[key], val_second=second[key], val_shuffle_effect=round(change[key], 6))


# Batches grouped by label: more than half of the targets' variance lies between batches (a random
# batch of 32 puts about 1/32 there).
GROUPED = 0.5


@probe(
    "pipeline-audit",
    title="Validation transforms, validation shuffling, training order",
    outcomes={"ok": "validation is deterministic and unshuffled; training batches are mixed",
              "val-augmented": "the same validation index gives different tensors (random transforms)",
              "train-grouped": "the training loader does not shuffle and its batches are grouped by label",
              "val-shuffled": "the validation loader shuffles"},
    timeout_s=30,
)
def pipeline_audit(ctx: ProbeContext):
    target = ctx.target
    started = time.monotonic()
    deadline = started + float(ctx.param("budget_s", 1.0))
    data: dict = {"val_augmented": False, "val_shuffled": False, "train_grouped": False}
    facts, artifacts = [], []
    val = target.val_loader
    if val is not None:
        ds = getattr(val, "dataset", None)
        if indexable(ds) and len(ds):
            n = len(ds)
            idx = sorted(set(np.linspace(0, n - 1, min(n, 8)).round().astype(int).tolist()))
            differ, biggest, pairs = _read_twice(ds, idx)
            data.update(val_read_twice=len(idx), val_differing=differ, val_max_change=biggest)
            if differ:
                data["val_augmented"] = True
                facts.append(f"{differ} of {len(idx)} validation items read twice differ (largest change {biggest:.3g}): "
                             f"the validation dataset applies random transforms")
                if pairs and torch.as_tensor(pairs[0][1]).dim() == 3:
                    imgs, caps = [], []
                    for i, a, b in pairs:
                        imgs += [_to_image(a), _to_image(b)]
                        caps += [f"val #{i}, read 1", f"val #{i}, read 2"]
                    artifacts.append(ImageGrid("val-reads", "One validation item read twice", imgs, caps))
            else:
                facts.append(f"{len(idx)} validation items read twice are identical")
        shuffles = _sampler_shuffles(val)
        data["val_sampler"] = type(getattr(val, "sampler", None)).__name__
        if shuffles:
            data["val_shuffled"] = True
            effect = _shuffle_effect(target, ctx)
            data.update(effect)
            if effect.get("val_shuffle_effect", 0.0) > SHUFFLE_EFFECT:
                facts.append(f"the validation loader shuffles ({data['val_sampler']}) and the same model evaluated twice "
                             f"reports {effect['val_metric']} {effect['val_first']:.4g}, then {effect['val_second']:.4g}: "
                             f"the reported metric depends on the order")
            elif "val_first" in effect:
                facts.append(f"the validation loader shuffles ({data['val_sampler']}); the same model evaluated twice "
                             f"reports {effect['val_metric']} {effect['val_first']:.4g} both times, so aggregate metrics are "
                             f"unaffected; per-batch curves and order-aligned outputs change from run to run")
            else:
                facts.append(f"the validation loader shuffles ({data['val_sampler']}): mean loss and accuracy do not "
                             f"depend on the order; per-batch curves and order-aligned outputs change from run to run")
    train = target.train_loader
    tds = getattr(train, "dataset", None)
    if indexable(tds) and len(tds):
        differ, biggest, _ = _read_twice(tds, sorted(set(np.linspace(0, len(tds) - 1, min(len(tds), 4)).round().astype(int).tolist())))
        data["train_augmented"] = bool(differ)
    train_shuffles = _sampler_shuffles(train)
    data["train_shuffled"] = train_shuffles
    data["train_sampler"] = type(getattr(train, "sampler", None)).__name__
    if train_shuffles is False:
        batches = _batch_targets(train, 32, deadline)
        share = _between_batch_share(batches, loss_kind(target) in ("class",) or not batches[0].is_floating_point()) if batches else None
        bs = len(batches[0]) if batches else 0
        data.update(between_batch_share=share, batch_size=bs, batches_read=len(batches))
        if share is not None:
            labels = [sorted(set(b.reshape(-1).tolist()))[:4] for b in batches[:6]] if not batches[0].is_floating_point() else []
            data["first_batch_labels"] = [str(l) for l in labels]
            if share > GROUPED:
                data["train_grouped"] = True
                facts.append(f"the training loader does not shuffle ({data['train_sampler']}) and {share:.0%} of the target "
                             f"variance lies between batches (random batches of {bs}: about {1 / max(bs, 1):.0%})"
                             + (f"; labels of batches spread over the epoch: {', '.join(data['first_batch_labels'])}" if labels else ""))
            else:
                facts.append(f"the training loader does not shuffle, but its batches are mixed ({share:.0%} of the target "
                             f"variance between batches)")
    data["seconds"] = round(time.monotonic() - started, 3)
    text = "; ".join(facts) or "nothing to audit"
    for outcome, flag in (("val-augmented", "val_augmented"), ("train-grouped", "train_grouped"), ("val-shuffled", "val_shuffled")):
        if data[flag]:
            return failed(outcome, text, artifacts, **data)
    return passed(text, artifacts=artifacts, **data)


# ---------------------------------------------------------------------------- label-signal-audit
def _features(x: torch.Tensor) -> torch.Tensor:
    """Vectors for nearest-neighbour comparisons: flattened (pooled) inputs, plus per-position means
    and stds for sequences, or a bag of tokens for integer inputs."""
    if not x.is_floating_point():
        ids = x.reshape(len(x), -1).long().clamp_min(0) % 2048
        bag = torch.zeros(len(x), 2048).scatter_add_(1, ids, torch.ones_like(ids, dtype=torch.float))
        return bag[:, bag.sum(0) > 0]
    flat = _flat(x, 1024)
    if x.dim() == 3:
        flat = torch.cat([flat, x.float().mean(1), x.float().std(1)], 1)
    return torch.nan_to_num(flat)


def _knn_predict(train_f, train_y, test_f, k: int, classes: int | None):
    d = torch.cdist(test_f, train_f)
    nn_idx = d.topk(min(k, len(train_f)), largest=False).indices
    votes = train_y[nn_idx]
    if classes:
        onehot = F.one_hot(votes.long(), classes).sum(1)
        return onehot.argmax(1)
    return votes.float().mean(1)


def _centroid_predict(train_f, train_y, test_f, classes: int):
    cents = torch.stack([train_f[train_y == c].mean(0) if (train_y == c).any() else torch.full_like(train_f[0], 1e9)
                         for c in range(classes)])
    return torch.cdist(test_f, cents).argmin(1)


@probe(
    "label-signal-audit",
    title="Do the labels carry signal about the inputs? (nearest neighbours against permuted labels)",
    outcomes={"ok": "simple models predict held-out labels well above the permuted-label baseline",
              "no-signal": "held-out labels are predicted no better than with permuted labels",
              "no-targets": "targets that cannot be scored",
              "few-per-class": "too few samples per class: most held-out labels are classes the fitted half lacks"},
    timeout_s=60,
)
@reads_samples
def label_signal_audit(ctx: ProbeContext):
    target = ctx.target
    fit, test, how = _split(target, ctx, int(ctx.param("max_train", 2048)), int(ctx.param("max_val", 1024)))
    if fit is None or fit.n < 20 or test is None or test.n < 20:
        return skipped("too few samples to measure label signal")
    y_fit, y_test = fit.y.reshape(len(fit.y), -1), test.y.reshape(len(test.y), -1)
    if y_fit.shape[1] != 1:
        return skipped("multi-value targets: label signal is not measured", "no-targets")
    y_fit, y_test = y_fit[:, 0], y_test[:, 0]
    flat = degenerate(torch.cat([y_fit, y_test]))
    if flat:
        return skipped(f"{flat}: permuting them changes nothing, so label signal cannot be measured (see label-audit)",
                       "no-targets")
    ff, tf = _features(fit.x), _features(test.x)
    mu, sd = ff.mean(0), ff.std(0).clamp_min(1e-6)
    ff, tf = (ff - mu) / sd, (tf - mu) / sd
    kind = loss_kind(target)
    integral = not y_fit.is_floating_point() or bool((y_fit == y_fit.round()).all())
    classes = int(max(y_fit.max(), y_test.max())) + 1 if kind in ("class", "binary") and integral and y_fit.min() >= 0 else None
    if classes:
        # A classifier fitted on these samples can only name classes it saw: when most held-out labels
        # are classes absent from the fitted half (a thousand classes, a few batches), real and permuted
        # labels both score about 0 and the comparison says nothing about the labels.
        reach = float(torch.isin(y_test.long(), y_fit.long()).float().mean())
        if reach < 0.5:
            return skipped(f"too few samples per class to measure label signal: {len(y_fit.long().unique())} classes "
                           f"among {fit.n} samples, and {reach:.0%} of the {test.n} held-out labels are classes seen "
                           f"there", "few-per-class", reach=round(reach, 3), classes=classes)
    gen = torch.Generator().manual_seed(ctx.seed)

    def score(labels):
        if classes:
            knn = float((_knn_predict(ff, labels, tf, 5, classes) == y_test.long()).float().mean())
            cen = float((_centroid_predict(ff, labels.long(), tf, classes) == y_test.long()).float().mean())
            return max(knn, cen), knn, cen
        pred = _knn_predict(ff, labels.float(), tf, 10, None)
        r = float(torch.corrcoef(torch.stack([pred, y_test.float()]))[0, 1]) if pred.std() > 0 else 0.0
        return (0.0 if math.isnan(r) else r), r, None

    real, knn, cen = score(y_fit)
    perms = [score(y_fit[torch.randperm(len(y_fit), generator=gen)])[0] for _ in range(3)]
    chance = sum(perms) / len(perms)
    m = test.n
    if classes:
        se = math.sqrt(max(chance * (1 - chance), 1e-4) / m)
        metric = "accuracy"
    else:
        se = 1 / math.sqrt(m)  # standard error of a correlation near zero
        metric = "correlation"
    margin = (real - chance) / se
    sampled = fit.sampled or test.sampled
    data = dict(metric=metric, score=round(real, 4), knn=round(knn, 4), centroid=None if cen is None else round(cen, 4),
                chance=round(chance, 4), margin_se=round(margin, 2), how=how, n_fit=fit.n, n_test=m, sampled=sampled,
                classes=classes)
    text = (f"nearest neighbours / class centroids fitted on {fit.n} samples predict {m} held-out labels ({how}) with "
            f"{metric} {real:.3f}; with permuted labels {chance:.3f} ({margin:+.1f} standard errors)")
    # No signal: the real labels do not beat permuted ones by 3 standard errors (or by 5 points of
    # accuracy / 0.1 of correlation): the labels say nothing about the inputs they are paired with.
    if margin < 3 or real - chance < (0.05 if classes else 0.1):
        return failed("no-signal", text, **data)
    return passed(text, **data)
