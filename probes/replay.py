"""Replay instruments: probes that only apply to a watch bundle's step (``nnwizard replay``); on any
other target they are skipped. They read the bundle's batch, its ring of earlier batches and the
run's recent history, and re-execute the saved step from the saved state.

- ``replay-batch``   is the step's batch itself bad: NaN/Inf inputs or targets, inputs or targets
                     orders of magnitude beyond the ring's batches (which rows), class ids outside the
                     model's outputs.
- ``replay-swap``    the same saved state on the batch before: does the anomaly come with this batch,
                     or does the state (weights, LR) break on any batch? Names the first op whose
                     output on this batch is far above the same op's output on the batch before.
- ``replay-repair``  exactly that step as configured, at lr/10 and with ``clip_grad_norm_(1.0)``:
                     after the update, are the weights finite and is the loss on this batch and the
                     batch before back inside the run's recent range?
- ``replay-history`` the learning rate and gradient norm over the logged history: did the LR rise
                     by an order of magnitude or more over the run, and keep rising after the step
                     with the best loss (the loss got worse as the LR grew)?

Thresholds: "far beyond" is a factor of ``EXTREME = 100`` over the largest |value| of the ring's
batches (minibatches of one dataset differ by a few x, not two orders of magnitude); the recent range
of the loss is the last 50 finite losses of the history, "in range" is below max + 3 x (max - min)
(the watch trigger's own rule); an LR rise counts from 10x.
"""

from __future__ import annotations

import math
import statistics

import torch

from nnwizard.record.frames import first_line
from nnwizard.record.optrace import OpTracer
from nnwizard.probes.api import LinePlot, ProbeContext, Table, failed, passed, probe, skipped
from nnwizard.probes.schedule_ahead import schedule_lines
from nnwizard.target import user_source_files

EXTREME = 100.0
LR_RISE = 10.0
RANGES = 3.0


def _bundle_target(ctx: ProbeContext):
    target = ctx.target
    return target if getattr(target, "bundle", None) is not None else None


def _floats(obj, out=None, where="") -> list[tuple[str, torch.Tensor]]:
    out = [] if out is None else out
    if isinstance(obj, torch.Tensor):
        if obj.is_floating_point() and obj.numel():
            out.append((where or "tensor", obj))
    elif isinstance(obj, (list, tuple)):
        for i, o in enumerate(obj):
            _floats(o, out, f"{where}[{i}]")
    elif isinstance(obj, dict):
        for k, o in obj.items():
            _floats(o, out, f"{where}.{k}" if where else str(k))
    return out


def _absmax(tensors) -> float:
    values = [float(t.detach().float().nan_to_num(0.0, 0.0, 0.0).abs().max()) for _, t in tensors]
    return max(values) if values else 0.0


def _rows(t: torch.Tensor, mask_fn) -> list[int]:
    if t.dim() == 0:
        return []
    mask = mask_fn(t.detach().float()).reshape(len(t), -1).any(1)
    return torch.nonzero(mask).flatten().tolist()[:8]


def recent_range(history: list[dict]) -> tuple[float, float] | None:
    losses = [h["loss"] for h in history if isinstance(h.get("loss"), (int, float)) and math.isfinite(h["loss"])]
    losses = losses[-50:]
    return (min(losses), max(losses)) if len(losses) >= 5 else None


def _in_range(loss: float, rng: tuple[float, float] | None) -> bool:
    if not math.isfinite(loss):
        return False
    if rng is None:
        return True
    lo, hi = rng
    return loss <= hi + RANGES * max(hi - lo, 1e-12)


def _history_before(target) -> list[dict]:
    step = target.bundle.step
    return [h for h in target.bundle.meta.get("history", []) if h.get("step", 0) < step]


# ------------------------------------------------------------------------------------ replay-batch
@probe(
    "replay-batch",
    title="Is the replayed step's batch itself bad (NaN/Inf, extreme values, class ids out of range)?",
    outcomes={"ok": "the batch is finite and within the range of the batches before it",
              "nonfinite": "the batch's inputs or targets hold NaN/Inf",
              "extreme": "inputs or targets are orders of magnitude beyond the batches before",
              "labels": "class ids outside the model's outputs", "no-bundle": "not a replay"},
    timeout_s=30,
)
def replay_batch(ctx: ProbeContext):
    target = _bundle_target(ctx)
    if target is None:
        return skipped("only a watch bundle's step can be replayed", "no-bundle")
    batches = target.batches(len(target.train_loader))
    step, ring = batches[0], batches[1:]
    inputs, targets = _floats(step[0]), _floats(step[1])
    data = dict(step=target.bundle.step, ring=len(ring), input_tensors=len(inputs))
    bad_in = [(w, t) for w, t in inputs if not bool(torch.isfinite(t).all())]
    bad_t = [(w, t) for w, t in targets if not bool(torch.isfinite(t).all())]
    if bad_in or bad_t:
        w, t = (bad_in or bad_t)[0]
        kind = "inputs" if bad_in else "targets"
        rows = _rows(t, lambda v: ~torch.isfinite(v))
        n = int((~torch.isfinite(t)).sum())
        data.update(tensor=kind, where=w, rows=rows, bad_values=n, nan=int(torch.isnan(t).sum()), inf=int(torch.isinf(t).sum()))
        return failed("nonfinite", f"step {target.bundle.step}: the batch's {kind} ({w}) hold {n} NaN/Inf values "
                      f"in rows {rows} before any op ran", **data)
    # class ids against the model's output width
    for spec, y in zip(target.recipe.get("losses", []), step[1]["targets"]):
        shape = (spec.get("input") or {}).get("shape") or []
        if spec["fn"] in ("cross_entropy", "nll_loss") and isinstance(y, torch.Tensor) and not y.is_floating_point() \
                and len(shape) >= 2 and y.numel():
            ignore = spec["kwargs"].get("ignore_index", -100)
            valid = y[y != ignore]
            if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= shape[1]):
                rows = torch.nonzero((y != ignore) & ((y < 0) | (y >= shape[1]))).flatten().tolist()[:8]
                data.update(classes=shape[1], label_min=int(valid.min()), label_max=int(valid.max()), rows=rows)
                return failed("labels", f"step {target.bundle.step}: class ids {int(valid.min())}..{int(valid.max())} "
                              f"for a model with {shape[1]} outputs (rows {rows})", **data)
    if not ring:
        data.update(note="no earlier batch in the bundle to compare with")
        return passed("the batch is finite; no earlier batch was saved to compare its range with", **data)
    rows_table = []
    for kind, here, before in (("inputs", inputs, [_floats(b[0]) for b in ring]),
                               ("targets", targets, [_floats(b[1]) for b in ring])):
        if not here:
            continue
        now, past = _absmax(here), max((_absmax(b) for b in before), default=0.0)
        rows_table.append([kind, f"{now:.4g}", f"{past:.4g}", f"{now / past:.3g}x" if past > 0 else "-"])
        data[f"{kind}_absmax"], data[f"{kind}_ring_absmax"] = now, past
        if past > 0 and now > EXTREME * past:
            w, t = max(here, key=lambda wt: _absmax([wt]))
            rows = _rows(t, lambda v: v.nan_to_num(0.0, 0.0, 0.0).abs() > EXTREME * past)
            data.update(tensor=kind, where=w, rows=rows, absmax=now, ring_absmax=past, ratio=now / past)
            table = Table("replay-batch", "Largest |value| in this batch and in the batches before it",
                          ["tensor", "this batch", f"{len(ring)} batches before", "ratio"], rows_table)
            return failed("extreme", f"step {target.bundle.step}: the batch's {kind} reach |x| = {now:.4g} in rows {rows}, "
                          f"{now / past:.3g}x the largest value of the {len(ring)} batches before ({past:.4g})", [table], **data)
    table = Table("replay-batch", "Largest |value| in this batch and in the batches before it",
                  ["tensor", "this batch", f"{len(ring)} batches before", "ratio"], rows_table)
    return passed(f"the batch is finite and within {EXTREME:g}x of the {len(ring)} batches before it "
                  f"(inputs |x| <= {data.get('inputs_absmax', 0):.4g})", artifacts=[table], **data)


# ------------------------------------------------------------------------------------- replay-swap
def _evaluate(target, model, batch, files=None):
    """Forward, loss, backward on one batch at the model's current state (no update): loss, grad norm,
    and the per-op largest |output| in call order when files are given."""
    model.zero_grad(set_to_none=True)
    if batch[2].get("rng") is not None:
        torch.random.set_rng_state(batch[2]["rng"])
    ops: list[tuple] = []

    def on_op(rec, func, args, out, kwargs):
        if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel() and rec.phase in ("forward", "loss"):
            ops.append((rec, float(out.detach().float().nan_to_num(0.0, 0.0, 0.0).abs().max()), not bool(torch.isfinite(out).all())))

    if files is not None:
        with OpTracer(model, files, locate=True, record="all", on_op=on_op, max_records=50000):
            loss = target.loss_fn(model(batch[0]), batch[1])
    else:
        loss = target.loss_fn(model(batch[0]), batch[1])
    value = float(loss.detach())
    norm = math.nan
    if loss.requires_grad:
        loss.backward()
        grads = [p.grad.detach().float() for p in model.parameters() if p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
    model.zero_grad(set_to_none=True)
    return value, norm, ops


@probe(
    "replay-swap",
    title="The saved state on the batch before: does the anomaly come with this batch or with the state?",
    outcomes={"batch": "the batch before stays in range at the same state; this batch does not",
              "state": "the batch before breaks too: the weights/LR are the problem, not this batch",
              "not-reproduced": "re-executed, this step's loss and gradient are in range",
              "no-ring": "no earlier batch in the bundle", "no-bundle": "not a replay",
              "not-replayable": "the step cannot be re-executed from the bundle"},
    timeout_s=60,
)
def replay_swap(ctx: ProbeContext):
    target = _bundle_target(ctx)
    if target is None:
        return skipped("only a watch bundle's step can be replayed", "no-bundle")
    if target.loss_fn is None:
        return skipped(target.recipe.get("why_not") or "the step cannot be re-executed", "not-replayable")
    batches = target.batches(len(target.train_loader))
    files = user_source_files(target)
    history = _history_before(target)
    rng = recent_range(history)
    # the trigger's window: the last 50 *measured* norms (watch measures the norm every k steps)
    norms = [h["grad_norm"] for h in history if isinstance(h.get("grad_norm"), (int, float)) and math.isfinite(h["grad_norm"])][-50:]
    med = statistics.median(norms) if norms else None
    model = target.fresh_model(ctx.seed).train()
    try:
        loss, gnorm, ops = _evaluate(target, model, batches[0], files)
    except Exception as exc:  # noqa: BLE001
        return failed("not-reproduced", f"re-executing step {target.bundle.step} raised: {first_line(exc)}", error=first_line(exc))

    def ok(l, g):
        return _in_range(l, rng) and math.isfinite(g) and (med is None or g <= 10 * med)

    data = dict(step=target.bundle.step, loss=loss, grad_norm=gnorm, recorded_loss=target.bundle.meta.get("loss"),
                recorded_grad_norm=target.bundle.meta.get("grad_norm"), range=list(rng) if rng else None,
                median_grad_norm=med)
    first_bad = next((r for r, _, bad in ops if bad and not r.nonfinite_in), None)
    if first_bad is not None:
        data.update(op=first_bad.op, where=first_bad.where or "?", op_text=first_bad.describe())
    if ok(loss, gnorm):
        return passed(f"re-executed step {target.bundle.step}: loss {loss:.4g}, gradient norm {gnorm:.4g}, both in the "
                      f"run's recent range: the anomaly did not reproduce", "not-reproduced", **data)
    if len(batches) < 2:
        return passed("no batch before this one was saved", "no-ring", **data)
    before = batches[1]
    model = target.fresh_model(ctx.seed).train()
    prev_loss, prev_norm, prev_ops = _evaluate(target, model, before, files)
    data.update(prev_step=before[2].get("step"), prev_loss=prev_loss, prev_grad_norm=prev_norm)
    table = Table("replay-swap", f"The state before step {target.bundle.step} on this batch and on the batch before",
                  ["batch", "loss", "gradient norm", "in range"],
                  [[f"step {target.bundle.step} (this)", f"{loss:.4g}", f"{gnorm:.4g}", ok(loss, gnorm)],
                   [f"step {before[2].get('step')} (before)", f"{prev_loss:.4g}", f"{prev_norm:.4g}", ok(prev_loss, prev_norm)]])
    if ok(prev_loss, prev_norm):
        # the first op whose output on this batch is far above the same op on the batch before
        jump = None
        if len(ops) == len(prev_ops):
            for (rec, v, bad), (_, pv, _) in zip(ops, prev_ops):
                if bad or (pv > 0 and v > EXTREME * pv):
                    jump = (rec, v, pv)
                    break
        if jump is not None:
            rec, v, pv = jump
            data.update(jump_op=rec.op, jump_where=rec.where or "?", jump_text=rec.describe(), jump_value=v, jump_before=pv)
            if "op_text" not in data:
                data.update(op=rec.op, where=rec.where or "?", op_text=rec.describe())
        where = f"; the first op far above the batch before: {data['jump_text']} (|out| {data['jump_value']:.4g} vs " \
                f"{data['jump_before']:.4g})" if jump is not None else ""
        return failed("batch", f"the state before step {target.bundle.step} gives loss {prev_loss:.4g} on the batch before "
                      f"(in range) and {loss:.4g} on this batch{where}", [table], **data)
    forward = [o for o in ops if o[0].phase == "forward"]
    if forward:
        rec, v, _ = max(forward, key=lambda o: o[1])
        data.update(peak_op=rec.op, peak_where=rec.where or "?", peak_text=rec.describe(), peak_value=v)
    return failed("state", f"the state before step {target.bundle.step} is already off: loss {prev_loss:.4g} on the batch "
                  f"before and {loss:.4g} on this one (recent range {rng[0]:.4g}..{rng[1]:.4g})" if rng else
                  f"the state before step {target.bundle.step} is already off on the batch before too", [table], **data)


# ----------------------------------------------------------------------------------- replay-repair
def _variant(target, batches, name: str, max_norm: float):
    model = target.fresh_model(0).train()
    optimizer = target.make_optimizer(model)
    if name == "lr/10":
        for g in optimizer.param_groups:
            g["lr"] = g["lr"] * 0.1
    handle = None
    if name == "clip":
        params = [p for p in model.parameters() if p.requires_grad]

        def clip(opt, args, kwargs):
            torch.nn.utils.clip_grad_norm_(params, max_norm)  # returning None keeps step()'s arguments

        handle = optimizer.register_step_pre_hook(clip)
    try:
        step_loss = target.train_step(model, batches[0], optimizer)
    except Exception:  # noqa: BLE001
        step_loss = math.nan
    finally:
        if handle is not None:
            handle.remove()
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    after = []
    with torch.no_grad():
        for b in batches[:2]:
            try:
                if b[2].get("rng") is not None:
                    torch.random.set_rng_state(b[2]["rng"])
                after.append(float(target.loss_fn(model(b[0]), b[1])))
            except Exception:  # noqa: BLE001
                after.append(math.nan)
    return dict(step_loss=step_loss, finite=finite, after=after)


@probe(
    "replay-repair",
    title="Exactly that step at lr/10 and with clip_grad_norm_(1.0): do the weights stay finite and the loss in range?",
    outcomes={"lr-fixes": "lr/10 keeps it in range, clipping does not", "clip-fixes": "clipping keeps it, lr/10 does not",
              "both-fix": "both keep it in range", "neither": "both still break",
              "ok": "as configured the step already stays in range", "no-bundle": "not a replay",
              "not-replayable": "the step cannot be re-executed from the bundle"},
    timeout_s=60,
)
def replay_repair(ctx: ProbeContext):
    target = _bundle_target(ctx)
    if target is None:
        return skipped("only a watch bundle's step can be replayed", "no-bundle")
    if target.loss_fn is None:
        return skipped(target.recipe.get("why_not") or "the step cannot be re-executed", "not-replayable")
    max_norm = float(ctx.param("max_norm", 1.0))
    batches = target.batches(2)
    rng = recent_range(_history_before(target))
    runs = {name: _variant(target, batches, name, max_norm) for name in ("as configured", "lr/10", "clip")}

    def good(r):
        return r["finite"] and all(_in_range(a, rng) for a in r["after"])

    def said(r):
        after = ", ".join(f"{a:.4g}" for a in r["after"])
        return ("weights finite" if r["finite"] else "weights non-finite") + f", loss after the step {after}"

    data = dict(step=target.bundle.step, max_norm=max_norm, range=list(rng) if rng else None, steps_run=3,
                **{f"{k.replace('/', '').replace(' ', '_')}_text": said(v) for k, v in runs.items()},
                **{f"{k.replace('/', '').replace(' ', '_')}_ok": good(v) for k, v in runs.items()})
    table = Table("replay-repair", f"Step {target.bundle.step} re-executed three ways",
                  ["variant", "loss of the step", "weights finite", "loss after (this batch, batch before)", "in range"],
                  [[k, f"{v['step_loss']:.4g}", v["finite"], ", ".join(f"{a:.4g}" for a in v["after"]), good(v)]
                   for k, v in runs.items()])
    text = "; ".join(f"{k}: {said(v)}" for k, v in runs.items())
    if good(runs["as configured"]):
        return passed(f"as configured step {target.bundle.step} already stays in range ({said(runs['as configured'])})",
                      artifacts=[table], **data)
    lr, clip = good(runs["lr/10"]), good(runs["clip"])
    outcome = "both-fix" if lr and clip else "lr-fixes" if lr else "clip-fixes" if clip else "neither"
    return failed(outcome, text, [table], **data)


# ---------------------------------------------------------------------------------- replay-history
EARLY_STEPS = 10     # "from the start": the run's first steps
EARLY_RISE = 30.0    # the loss this many times its first value (a divergence, not minibatch noise)


def _diverged_from_start(points: list[dict]) -> tuple[str, dict] | None:
    """The loss at EARLY_RISE x its first value within the run's first EARLY_STEPS steps, the LR steady:
    (summary, data), else None. Needs the history from step 1 (watch keeps every step's loss)."""
    if len(points) < 2 or points[0].get("step") != 1 or not points[0]["loss"] > 0:
        return None
    first = points[0]
    early = [h for h in points if h["step"] <= EARLY_STEPS]
    jump = next((h for h in early if h["loss"] >= EARLY_RISE * first["loss"]), None)
    lrs = [h["lr"] for h in early]
    if jump is None or not min(lrs) > 0 or max(lrs) / min(lrs) >= LR_RISE:
        return None
    text = (f"the loss went from {first['loss']:.4g} at step 1 to {jump['loss']:.4g} at step {jump['step']} "
            f"({jump['loss'] / first['loss']:.0f}x) at lr {lrs[0]:.3g}" +
            (" throughout" if max(lrs) == min(lrs) else f" to {max(lrs):.3g}") + ": the first updates broke the model")
    return text, dict(first_loss=first["loss"], jump_step=jump["step"], jump_loss=jump["loss"], lr=lrs[0],
                      points=len(points))


@probe(
    "replay-history",
    title="The learning rate and gradient norm over the watch history before the anomaly",
    outcomes={"lr-rose": "the LR rose 10x or more over the run and kept rising after the best loss",
              "ramp": "the LR was still rising at the anomaly (a warm-up or ramp under way)",
              "lr-steady": "the LR did not rise so",
              "diverged-from-start": "the loss left its starting level within the run's first steps at an LR that did not rise: the first updates broke the model",
              "no-history": "too little history", "no-bundle": "not a replay"},
    timeout_s=10,
)
def replay_history(ctx: ProbeContext):
    target = _bundle_target(ctx)
    if target is None:
        return skipped("only a watch bundle's step can be replayed", "no-bundle")
    meta = target.bundle.meta
    history = [h for h in meta.get("history", []) if h.get("step", 0) <= target.bundle.step]
    points = [h for h in history if isinstance(h.get("loss"), (int, float)) and math.isfinite(h["loss"])
              and isinstance(h.get("lr"), (int, float))]
    early = _diverged_from_start(points)
    if early is not None:
        return failed("diverged-from-start", early[0], **early[1])
    if len(points) < 5:
        return passed(f"only {len(points)} logged steps before the anomaly", "no-history", points=len(points))
    best = min(points, key=lambda h: h["loss"])
    lr_now = meta.get("lrs", [None])[0]
    lr_now = float(lr_now) if isinstance(lr_now, (int, float)) else points[-1]["lr"]
    starts = [h for h in [meta.get("first") or {}] + points if isinstance(h.get("lr"), (int, float)) and h["lr"] > 0]
    first = starts[0] if starts else points[0]
    norms = [h["grad_norm"] for h in points if isinstance(h.get("grad_norm"), (int, float)) and math.isfinite(h["grad_norm"])]
    data = dict(step=target.bundle.step, lr_now=lr_now, lr_first=first["lr"], first_step=first["step"],
                best_step=best["step"], best_loss=best["loss"], lr_at_best=best["lr"], lr_max=max(h["lr"] for h in points),
                grad_norm_first=norms[0] if norms else math.nan, grad_norm_last=norms[-1] if norms else math.nan,
                points=len(points))
    data["lr_rise"] = lr_now / first["lr"] if first["lr"] > 0 else math.inf
    data["lr_since_best"] = lr_now / best["lr"] if best["lr"] > 0 else math.inf
    plot = LinePlot("replay-history", f"The watch history up to step {target.bundle.step}",
                    {"loss": [h["loss"] for h in points]}, x=[h["step"] for h in points],
                    marks={f"anomaly (step {target.bundle.step})": target.bundle.step})
    lr_plot = LinePlot("replay-lr", "Learning rate", {"lr": [h["lr"] for h in points]}, x=[h["step"] for h in points],
                       ylabel="lr", logy=all(h["lr"] > 0 for h in points))
    rose = best["step"] < target.bundle.step and data["lr_rise"] >= LR_RISE and data["lr_since_best"] > 1.2
    data.update(_ramp(points, lr_now, target.bundle.step))
    lines = schedule_lines([meta.get("script")] + [str(p) for p in user_source_files(target)])
    data["schedule_line"] = lines[0] if lines else "?"
    schedule = f"; the schedule is set at {lines[0]}" if lines else ""
    if rose:
        text = (f"the lr rose from {first['lr']:.3g} at step {first['step']} to {lr_now:.3g} at step {target.bundle.step} "
                f"({data['lr_rise']:.3g}x); the loss was lowest ({best['loss']:.4g}) at step {best['step']} with lr "
                f"{best['lr']:.3g} and got worse while the lr kept rising ({data['lr_since_best']:.3g}x since)")
    else:
        text = (f"the lr went from {first['lr']:.3g} at step {first['step']} to {lr_now:.3g} at step {target.bundle.step} "
                f"({data['lr_rise']:.3g}x); the loss was lowest ({best['loss']:.4g}) at step {best['step']} with lr "
                f"{best['lr']:.3g}")
    if rose:
        return failed("lr-rose", text + schedule, [plot, lr_plot], **data)
    if data["ramping"]:
        return failed("ramp", f"{text}; at the anomaly the lr was still rising: {data['ramp_from']:.3g} -> {lr_now:.3g} "
                      f"({data['ramp_rise']:.3g}x) over the last {data['ramp_steps']} steps{schedule}", [plot, lr_plot], **data)
    return passed(text, "lr-steady", artifacts=[plot, lr_plot], **data)


RAMP_STEPS = 25      # the logged steps before the anomaly a ramp is read over
RAMP_RISE = 1.1      # the rate rose at least this much over them, and never fell


def _ramp(points: list[dict], lr_now: float, step: int) -> dict:
    """Was the rate still climbing when the anomaly came? (a warm-up under way)"""
    recent = [h for h in points if step - RAMP_STEPS <= h["step"] <= step]
    lrs = [h["lr"] for h in recent] + [lr_now]
    if len(recent) < 2 or not lrs[0] > 0:
        return dict(ramping=False)
    rising = all(b >= a * (1 - 1e-9) for a, b in zip(lrs, lrs[1:])) and lrs[-1] >= RAMP_RISE * lrs[0]
    return dict(ramping=rising, ramp_from=lrs[0], ramp_rise=lrs[-1] / lrs[0], ramp_steps=step - recent[0]["step"])
