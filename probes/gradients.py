"""Gradient and activation instruments: per-parameter gradient norms (none, zero, huge, the trend
with depth, update-to-parameter ratios) and per-layer activation statistics (dead ReLU units,
saturated sigmoid/tanh outputs), measured on the user's model, data and step."""

from __future__ import annotations

import math
import time

import torch

from nnwizard.record.frames import first_line
from nnwizard.record.optrace import OpTracer
from nnwizard.probes.api import BarPlot, ProbeContext, Table, cannot_run, failed, passed, probe

# Thresholds (see the README): a gradient norm below 1e-9 is zero at float32 resolution for weights
# of order 1e-2..1; above 1e3 no sane loss at chance level produces it (initial per-parameter norms
# are O(1e-3..10)); three orders of magnitude between the first and the last weight layer's
# relative gradient (|g|/|w|) is what a deep sigmoid stack shows and ReLU/residual nets never do.
ZERO_GRAD = 1e-9
HUGE_GRAD = 1e3
VANISH_RATIO = 1e-3
DEAD_FRACTION = 0.5
SATURATED_FRACTION = 0.5


def _batches(target, n):
    try:
        n = min(n, len(target.train_loader))
    except TypeError:
        pass
    return target.batches(max(1, n))


@probe(
    "grad-norms",
    title="Gradient norm per parameter, its trend with depth, update-to-parameter ratios",
    outcomes={"ok": "every parameter gets a finite, non-zero gradient of sane size",
              "exploding": "some gradient norm is huge (> 1e3) or non-finite",
              "vanishing": "gradients shrink by orders of magnitude towards the first layers",
              "zero": "some parameters get an exactly zero gradient",
              "disconnected": "some trainable parameters get no gradient at all (not connected to the loss)"},
    timeout_s=60,
    cost=7,
)
def grad_norms(ctx: ProbeContext):
    target = ctx.target
    model = target.fresh_model(ctx.seed).train()
    inputs, targets = target.batch()
    try:
        loss = target.loss_fn(model(inputs), targets)
        loss.backward()
    except Exception as exc:  # noqa: BLE001
        return cannot_run(f"forward/backward raised: {first_line(exc)}", reason="raised", error=first_line(exc))
    rows, names, norms, rels = [], [], [], []
    none, zero, huge = [], [], []
    weights = []  # (name, relative gradient) of weight matrices/kernels, in registration order
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if p.grad is None:
            none.append(name)
            rows.append([name, list(p.shape), "None", "-", "-"])
            continue
        g = float(p.grad.detach().float().norm())
        w = float(p.detach().float().norm())
        rel = g / w if w > 0 else math.inf
        names.append(name)
        norms.append(g)
        rels.append(rel)
        if not math.isfinite(g) or g > HUGE_GRAD:
            huge.append(name)
        elif g < ZERO_GRAD:
            zero.append(name)
        if p.dim() >= 2:
            weights.append((name, rel, g))
        rows.append([name, list(p.shape), f"{g:.3g}", f"{w:.3g}", f"{rel:.3g}"])
    # update-to-parameter ratio over a few real steps of the user's step
    steps = int(ctx.param("steps", 5))
    fresh = target.fresh_model(ctx.seed)
    optimizer = target.make_optimizer(fresh)
    ratios: dict[str, list[float]] = {}
    try:
        for batch in _batches(target, steps):
            before = {n: p.detach().clone() for n, p in fresh.named_parameters() if p.requires_grad}
            target.train_step(fresh, batch, optimizer)
            for n, p in fresh.named_parameters():
                if n in before and p.dim() >= 2:
                    w = float(before[n].norm())
                    if w > 0:
                        ratios.setdefault(n, []).append(float((p.detach() - before[n]).norm()) / w)
    except Exception:  # noqa: BLE001 - the loop probes audit a raising step; here we only lose the ratios
        ratios = {}
    per_layer = {n: sorted(v)[len(v) // 2] for n, v in ratios.items() if v}
    update_ratio = sorted(per_layer.values())[len(per_layer) // 2] if per_layer else math.nan
    for row in rows:
        row.append(f"{per_layer[row[0]]:.2g}" if row[0] in per_layer else "-")
    depth_ratio = weights[0][1] / weights[-1][1] if len(weights) >= 3 and weights[-1][1] > 0 else math.nan
    marked = [i for i, r in enumerate(rows) if r[0] in none + zero + huge]
    table = Table("grad-norms", "Gradient norm per parameter (first batch, before any step)",
                  ["parameter", "shape", "|grad|", "|param|", "|grad|/|param|", "update/param"], rows, marked)
    plot = BarPlot("grad-norm-by-layer", "Gradient norm by layer (input to output)", names,
                   [max(v, 1e-30) if math.isfinite(v) else 1e30 for v in norms], ylabel="|grad|", logy=True)
    finite_norms = [n for n in norms if math.isfinite(n)]
    data = dict(loss=float(loss.detach()), parameters=len(rows), none=none, zero=zero, huge=huge,
                none_count=len(none), zero_count=len(zero), huge_count=len(huge),
                max_norm=max(finite_norms) if finite_norms else math.nan,
                max_layer=names[norms.index(max(finite_norms))] if finite_norms else "?",
                depth_ratio=depth_ratio, update_ratio=update_ratio, weight_layers=len(weights),
                first_layer=weights[0][0] if weights else "?", last_layer=weights[-1][0] if weights else "?",
                first_rel=weights[0][1] if weights else math.nan, last_rel=weights[-1][1] if weights else math.nan,
                first_norm=weights[0][2] if weights else math.nan, last_norm=weights[-1][2] if weights else math.nan)
    arts = [plot, table]
    upd = f"; median update/param {update_ratio:.2g}" if math.isfinite(update_ratio) else ""
    if huge:
        return failed("exploding", f"{len(huge)} parameter(s) with |grad| > {HUGE_GRAD:g} on the first batch, largest "
                      f"{data['max_norm']:.3g} at {data['max_layer']}{upd}", arts, **data)
    if math.isfinite(depth_ratio) and depth_ratio < VANISH_RATIO:
        return failed("vanishing", f"relative gradient |g|/|w| {data['first_rel']:.2g} at the first layer "
                      f"{data['first_layer']} against {data['last_rel']:.2g} at the last {data['last_layer']}: "
                      f"{depth_ratio:.2g}x over {len(weights)} weight layers{upd}", arts, **data)
    if none:
        return failed("disconnected", f"{len(none)} trainable parameter(s) get no gradient: {', '.join(none[:5])}", arts, **data)
    if zero:
        return failed("zero", f"{len(zero)} parameter(s) get a zero gradient (< {ZERO_GRAD:g}): {', '.join(zero[:5])}{upd}",
                      arts, **data)
    span = f"; first/last layer relative gradient {depth_ratio:.2g}" if math.isfinite(depth_ratio) else ""
    return passed(f"{len(names)} parameters, |grad| up to {data['max_norm']:.3g} ({data['max_layer']}){span}{upd}",
                  artifacts=arts, **data)


# ----------------------------------------------------------------------------------- activation-stats
_RELU = {"relu", "relu_", "relu6", "hardtanh"}  # zero (or clipped) below a threshold: can die
_SQUASH = {"sigmoid", "sigmoid_", "tanh", "tanh_"}


def _activation_stats(model, inputs, files) -> dict[str, dict]:
    stats: dict[str, dict] = {}

    def on_op(rec, func, args, out, kwargs):
        op = rec.op
        if op not in _RELU and op not in _SQUASH:
            return
        if not isinstance(out, torch.Tensor) or out.dim() < 1 or len(out) < 2:
            return
        label = rec.module if rec.module_type and rec.module_type.lower().rstrip("6") in (
            "relu", "sigmoid", "tanh", "hardtanh", "relu") else f"{rec.module or '(model)'}:{op}"
        v = out.detach().float().reshape(len(out), -1)
        entry = stats.setdefault(label, {"op": op.rstrip("_"), "calls": 0})
        entry["calls"] += 1
        if op in _RELU:
            entry["dead"] = max(entry.get("dead", 0.0), float((v <= 0).all(0).float().mean()))
        else:
            if op.startswith("sigmoid"):
                tails = (v < 0.01) | (v > 0.99)
            else:
                tails = v.abs() > 0.99
            entry["saturated"] = max(entry.get("saturated", 0.0), float(tails.float().mean()))
        entry["std"] = float(v.std())

    tracer = OpTracer(model, files, locate=False, on_op=on_op)
    with tracer, torch.no_grad():
        model(inputs)
    return stats


def _train_and_measure(ctx, batches, steps: int, inputs, files, factor: float = 1.0):
    """Train a fresh model (same seed) through the user's step at lr x factor; (stats, steps, losses)."""
    target = ctx.target
    model = target.fresh_model(ctx.seed)
    model.train()
    optimizer = target.make_optimizer(model)
    for group in optimizer.param_groups:
        if "lr" in group:
            group["lr"] = group["lr"] * factor
    losses: list[float] = []
    for i in range(steps):
        losses.append(float(target.train_step(model, batches[i % len(batches)], optimizer)))
        if ctx.time_left() < 2:
            break
    return (_activation_stats(model, inputs, files) if losses else {}), len(losses), losses


def _late_loss(losses: list[float]) -> float:
    """Mean of the last quarter of a training run's losses (inf when any of them is not finite)."""
    tail = losses[-max(1, len(losses) // 4):]
    return sum(tail) / len(tail) if tail and all(map(math.isfinite, tail)) else math.inf


def _lower_lr_cure(ctx, batches, steps: int, inputs, files, layer: str, losses: list[float],
                   key: str = "dead") -> dict | None:
    """Units that died (``key`` "dead") or saturated ("saturated") while training: rerun the same steps from the
    same weights at lr/10, lr/100, lr/1000. The step size is the cause when a lower rate keeps the layer alive
    (unsaturated) AND trains better (a lower late loss); a lower rate that only moves the weights less keeps
    units alive trivially and does not count."""
    limit = DEAD_FRACTION if key == "dead" else SATURATED_FRACTION
    base = _late_loss(losses)
    for runs, factor in enumerate((0.1, 0.01, 0.001), start=1):
        # each rerun costs about what each training run so far cost: only within this probe's allowance
        # (the probes after it share what is left of the session's budget)
        spent = time.monotonic() - ctx.started
        if ctx.time_left() < 4 or (ctx.allowance_s is not None and spent + spent / runs > ctx.allowance_s):
            return None
        try:
            stats, done, low = _train_and_measure(ctx, batches, steps, inputs, files, factor)
        except Exception:  # noqa: BLE001
            return None
        value = stats.get(layer, {}).get(key, math.nan)
        late = _late_loss(low)
        if done == steps and value <= limit and late < 0.9 * base:
            return dict(lr_factor=factor, **{f"{key}_lower_lr": value}, loss_lower_lr=late,
                        loss_lr=base if math.isfinite(base) else float("nan"))
    return None


@probe(
    "activation-stats",
    title="Dead ReLU units and saturated sigmoid/tanh outputs, per layer",
    outcomes={"ok": "no layer mostly dead or saturated", "dead": "over half of a ReLU layer's units are zero for every sample",
              "dead-lr": "ReLU units die during training at the configured lr and stay alive at a lower lr that trains better",
              "saturated": "over half of a sigmoid/tanh layer's outputs sit in the flat tails",
              "saturated-lr": "a sigmoid/tanh layer saturates during training at the configured lr and not at a lower lr "
                              "that trains better",
              "no-activations": "the model uses no ReLU/sigmoid/tanh"},
    timeout_s=60,
    share=0.08,
    floor=4,  # the statistics at init; its steps are optional
)
def activation_stats(ctx: ProbeContext):
    from nnwizard.target import user_source_files

    target = ctx.target
    files = user_source_files(target)
    inputs, _ = target.batch()
    model = target.fresh_model(ctx.seed)
    model.train()
    try:
        init = _activation_stats(model, inputs, files)
    except Exception as exc:  # noqa: BLE001
        return cannot_run(f"forward raised: {first_line(exc)}", reason="raised", error=first_line(exc))
    if not init:
        return passed("the model uses no ReLU, sigmoid or tanh", "no-activations")
    # the two traced forward passes cost about two steps; what is left trains (none: init only)
    steps = ctx.plan_steps(int(ctx.param("steps", 20)), minimum=0, fixed=4)
    batches = []
    try:
        batches = target.batches(max(1, min(steps, len(target.train_loader))))
        trained, done, losses = _train_and_measure(ctx, batches, steps, inputs, files)
    except Exception:  # noqa: BLE001
        trained, done, losses = {}, 0, []
    rows, labels, dead_vals = [], [], []
    worst_dead, worst_sat = None, None
    for label, s in init.items():
        t = trained.get(label, {})
        for key in ("dead", "saturated"):
            if key not in s:
                continue
            a, b = s[key], t.get(key, math.nan)
            value = max(a, b) if math.isfinite(b) else a
            when = "at initialisation" if a >= (b if math.isfinite(b) else -1) else f"after {done} steps"
            rows.append([label, s["op"], key, f"{a:.0%}", f"{b:.0%}" if math.isfinite(b) else "-", f"{s['std']:.3g}"])
            labels.append(f"{label} ({key})")
            dead_vals.append(value)
            item = (value, label, a, b, when)
            if key == "dead" and (worst_dead is None or value > worst_dead[0]):
                worst_dead = item
            if key == "saturated" and (worst_sat is None or value > worst_sat[0]):
                worst_sat = item
    table = Table("activations", f"Activation layers at initialisation and after {done} steps",
                  ["layer", "op", "measure", "at init", f"after {done} steps", "output std"], rows,
                  marked=[i for i, v in enumerate(dead_vals) if v > DEAD_FRACTION])
    plot = BarPlot("activation-health", "Dead / saturated fraction per activation layer", labels, dead_vals,
                   ylabel="fraction of units")
    data = dict(layers=len(init), steps=done)
    if worst_dead:
        data.update(dead_fraction=worst_dead[0], dead_layer=worst_dead[1], dead_init=worst_dead[2],
                    dead_trained=worst_dead[3], dead_when=worst_dead[4])
    if worst_sat:
        data.update(saturated_fraction=worst_sat[0], saturated_layer=worst_sat[1], saturated_init=worst_sat[2],
                    saturated_trained=worst_sat[3], saturated_when=worst_sat[4])
    arts = [plot, table]
    dead = worst_dead is not None and worst_dead[0] > DEAD_FRACTION
    sat = worst_sat is not None and worst_sat[0] > SATURATED_FRACTION
    if dead and (not sat or worst_dead[0] >= worst_sat[0]) and worst_dead[2] <= DEAD_FRACTION and done:
        # the units died during training, not at initialisation: is the step size the cause?
        cure = _lower_lr_cure(ctx, batches, done, inputs, files, worst_dead[1], losses)
        if cure:
            data.update(cure)
            return failed("dead-lr", f"ReLU layer '{worst_dead[1]}': {worst_dead[2]:.0%} of its units are zero for all "
                          f"{len(inputs)} samples at initialisation, {worst_dead[0]:.0%} after {done} steps at the "
                          f"configured learning rate, {cure['dead_lower_lr']:.0%} after {done} steps at lr x"
                          f"{cure['lr_factor']:g}, where the training loss also ended lower ({cure['loss_lower_lr']:.3g} "
                          f"against {cure['loss_lr']:.3g}): the units die of the step size", arts, **data)
    if dead and (not sat or worst_dead[0] >= worst_sat[0]):
        return failed("dead", f"ReLU layer '{worst_dead[1]}': {worst_dead[0]:.0%} of its units are zero for all "
                      f"{len(inputs)} samples {worst_dead[4]} ({worst_dead[2]:.0%} at initialisation)", arts, **data)
    if sat and worst_sat[2] <= SATURATED_FRACTION and done:
        # saturated by training, not at initialisation: the same question as for units that died
        cure = _lower_lr_cure(ctx, batches, done, inputs, files, worst_sat[1], losses, key="saturated")
        if cure:
            data.update(cure)
            return failed("saturated-lr", f"'{worst_sat[1]}': {worst_sat[2]:.0%} of its outputs sit in the flat tails "
                          f"at initialisation, {worst_sat[0]:.0%} after {done} steps at the configured learning rate, "
                          f"{cure['saturated_lower_lr']:.0%} after {done} steps at lr x{cure['lr_factor']:g}, where the "
                          f"training loss also ended lower ({cure['loss_lower_lr']:.3g} against {cure['loss_lr']:.3g}): "
                          f"the layer saturates because of the step size", arts, **data)
    if sat:
        return failed("saturated", f"'{worst_sat[1]}': {worst_sat[0]:.0%} of its outputs sit in the flat tails "
                      f"{worst_sat[4]} ({worst_sat[2]:.0%} at initialisation)", arts, **data)
    parts = []
    if worst_dead:
        parts.append(f"at most {worst_dead[0]:.0%} dead units ({worst_dead[1]})")
    if worst_sat:
        parts.append(f"at most {worst_sat[0]:.0%} saturated outputs ({worst_sat[1]})")
    return passed(f"{len(init)} activation layer(s): " + ", ".join(parts) + f" (init and after {done} steps)", artifacts=arts, **data)
