"""Learning-rate instruments: a short sweep (lr/10, lr, lr*10 from the same weights) and the
oscillation test (noise against progress, and what lr/3, gradient clipping and a doubled batch do
to it), all through the user's optimizer and step."""

from __future__ import annotations

import math

import torch

from nnwizard.record.frames import first_line
from nnwizard.probes.api import LinePlot, ProbeContext, Table, cannot_run, failed, passed, probe, skipped

# A run "moves" the loss when it removes at least 10% of it; one setting is "clearly better" than
# another when it ends a further 10% of the starting loss lower. Both are far above the evaluation
# noise of a fixed 256-sample set, and below what any healthy example does in 40 steps.
MOVES = 0.10
BETTER = 0.10
MIN_SWEEP = 10        # steps per learning rate below which a sweep compares noise
MIN_OSCILLATION = 40  # steps below which noise against progress cannot be told apart


def _eval_samples(target) -> int:
    """The fixed evaluation set's size: 256 samples, or 4 probe batches when the session slices them."""
    return 4 * target.sample_limit if target.sample_limit else 256


def _eval_cost(target, evals: int) -> float:
    """``evals`` evaluations of the fixed set, in plain steps: a forward pass costs about a third of a
    step, in proportion to its samples (batches below 32 are counted as 32: tiny batches are dominated
    by per-call overhead, not by their samples)."""
    batch = target.batch()
    per = len(batch[1]) if batch is not None else 1
    return evals * _eval_samples(target) / max(per, 32) / 3


def _eval_set(target, samples: int | None = None):
    """Fixed training samples (inputs, targets) to measure the loss on, at least ``samples`` of them."""
    samples = samples or _eval_samples(target)
    try:
        available = len(target.train_loader)
    except TypeError:
        available = 64
    xs, ys, n = [], [], 0
    for b in target.batches(min(available, 64)):
        xs.append(b[0])
        ys.append(b[1])
        n += len(b[1])
        if n >= samples:
            break
    return torch.cat(xs), torch.cat(ys)


def _loss_on(target, model, eval_set) -> float:
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            value = float(target.loss_fn(model(eval_set[0]), eval_set[1]).float().mean())
    finally:
        model.train(was)
    return value


def _run(ctx, factor: float = 1.0, steps: int = 40, clip: float | None = None, merge: int = 1, eval_set=None,
         every: int = 0):
    """Train a fresh model (same seed) through the user's step; returns (train losses, eval curve)."""
    target = ctx.target
    model = target.fresh_model(ctx.seed)
    optimizer = target.make_optimizer(model)
    for group in optimizer.param_groups:
        if "lr" in group:
            group["lr"] = group["lr"] * factor
    handle = None
    if clip is not None:
        params = [p for p in model.parameters() if p.requires_grad]

        def clip_hook(opt, args, kwargs):
            torch.nn.utils.clip_grad_norm_(params, clip)  # returns None: step()'s arguments unchanged

        handle = optimizer.register_step_pre_hook(clip_hook)
    try:
        n_batches = len(target.train_loader)
    except TypeError:
        n_batches = steps * merge
    batches = target.batches(min(n_batches, steps * merge))
    losses, curve = [], [(0, _loss_on(target, model, eval_set))] if eval_set is not None else []
    try:
        for step in range(steps):
            if merge == 1:
                batch = batches[step % len(batches)]
            else:  # one batch of merge x the size: the same gradient as accumulating `merge` micro-batches
                group = [batches[(step * merge + i) % len(batches)] for i in range(merge)]
                batch = (torch.cat([b[0] for b in group]), torch.cat([b[1] for b in group]))
            losses.append(target.train_step(model, batch, optimizer))
            if not math.isfinite(losses[-1]):
                break
            if eval_set is not None and every and (step + 1) % every == 0:
                curve.append((step + 1, _loss_on(target, model, eval_set)))
            if ctx.time_left() < 2:
                break
    finally:
        if handle is not None:
            handle.remove()
    final = _loss_on(target, model, eval_set) if eval_set is not None and all(map(math.isfinite, losses)) else math.nan
    if eval_set is not None and (not curve or curve[-1][0] != len(losses)):
        curve.append((len(losses), final))
    return losses, curve, final


@probe(
    "lr-sweep",
    title="Same weights, same batches: lr/10, lr and lr*10",
    outcomes={"ok": "the configured learning rate moves the loss and no other setting is clearly better",
              "too-low": "the loss barely moves at lr and clearly falls at lr*10",
              "too-high": "lr diverges or makes the loss worse while lr/10 does clearly better",
              "none-learns": "no setting of the learning rate moves the loss"},
    timeout_s=90,
    share=0.2,
    floor=4 * (MIN_SWEEP + 1),  # four rates at their minimum (their evaluations not counted)
)
def lr_sweep(ctx: ProbeContext):
    target = ctx.target
    wanted = int(ctx.param("steps", 40))
    # up to 4 runs (lr*100 when nothing moves), each evaluated 11 times on the fixed set
    steps = ctx.plan_steps(wanted, minimum=MIN_SWEEP, runs=4, fixed=4 * (_eval_cost(target, 11) + 1))
    if not steps:
        return ctx.unaffordable(MIN_SWEEP, "steps each learning rate needs", wanted=wanted)
    probe_opt = target.make_optimizer(target.fresh_model(ctx.seed))
    lr = probe_opt.param_groups[0].get("lr") if probe_opt.param_groups else None
    if lr is None:
        return skipped(f"{type(probe_opt).__name__} has no 'lr' to sweep")
    eval_set = _eval_set(target)
    runs = {}
    try:
        for factor in (0.1, 1.0, 10.0):
            losses, curve, final = _run(ctx, factor, steps, eval_set=eval_set, every=max(1, steps // 10))
            runs[factor] = dict(losses=losses, curve=curve, final=final, start=curve[0][1])
    except Exception as exc:  # noqa: BLE001
        return cannot_run(f"the training step raised: {first_line(exc)}", reason="raised", error=first_line(exc))
    start = runs[1.0]["start"]

    def drop(f):
        v = runs[f]["final"]
        return (start - v) / start if math.isfinite(v) and start > 0 else -math.inf

    d = {f: drop(f) for f in runs}
    # a short range test: when neither lr nor lr*10 moves the loss and lr*10 stayed finite, try lr*100
    if d[1.0] < MOVES and math.isfinite(d[10.0]) and d[10.0] < MOVES and ctx.param("extend", True):
        losses, curve, final = _run(ctx, 100.0, steps, eval_set=eval_set, every=max(1, steps // 10))
        runs[100.0] = dict(losses=losses, curve=curve, final=final, start=curve[0][1])
        d[100.0] = drop(100.0)
        # still nothing, and lr*100 still below the rates this optimizer usually trains at: one more decade, so that a
        # rate 1000x too low is measured rather than read as "no rate learns"
        usual = usual_lr(probe_opt)
        if d[100.0] < MOVES and math.isfinite(d[100.0]) and lr * 100 < usual and ctx.time_left() > 4:
            losses, curve, final = _run(ctx, 1000.0, steps, eval_set=eval_set, every=max(1, steps // 10))
            runs[1000.0] = dict(losses=losses, curve=curve, final=final, start=curve[0][1])
            d[1000.0] = drop(1000.0)
    data = dict(lr=lr, steps=steps, wanted_steps=wanted, start_loss=start, loss_lr10=runs[0.1]["final"], loss_lr=runs[1.0]["final"],
                loss_lrx10=runs[10.0]["final"], drop_lr10=d[0.1], drop_lr=d[1.0], drop_lrx10=d[10.0],
                lr_low=lr * 0.1, lr_high=lr * 10)
    up = _up(d)
    data.update(up_factor=up, lr_up=lr * up, drop_up=d[up])
    best = max(d, key=lambda f: d[f])
    data["best_lr"] = lr * best
    series = {f"lr={lr * f:.3g}": [v for _, v in runs[f]["curve"]] for f in runs}
    plot = LinePlot("lr-sweep", f"Loss on {len(eval_set[1])} fixed samples: lr/10, lr, lr*10 ({steps} steps)", series,
                    x=[s for s, _ in runs[1.0]["curve"]], logy=False)
    # the x axis differs when a run stops early; keep the series plottable
    longest = max(len(v) for v in series.values())
    plot.series = {k: v + [math.nan] * (longest - len(v)) for k, v in series.items()}
    plot.x = [s for s, _ in max((r["curve"] for r in runs.values()), key=len)]
    table = Table("lr-sweep", "Learning-rate sweep", ["lr", "loss after", "share of the loss removed"],
                  [[f"{lr * f:.3g}", f"{runs[f]['final']:.4g}", f"{d[f]:.0%}" if math.isfinite(d[f]) else "diverged"]
                   for f in runs], marked=[list(runs).index(best)])

    def pct(f):
        return f"{d[f]:.0%}" if math.isfinite(d[f]) else "diverged"

    text = (f"{steps} steps from the same weights, share of the loss {start:.4g} removed: lr/10 ({lr * 0.1:.3g}) {pct(0.1)}, "
            f"lr ({lr:.3g}) {pct(1.0)}, lr*10 ({lr * 10:.3g}) {pct(10.0)}"
            + (f", lr*100 ({lr * 100:.3g}) {pct(100.0)}" if 100.0 in d else "")
            + (f", lr*1000 ({lr * 1000:.3g}) {pct(1000.0)}" if 1000.0 in d else ""))
    data["text"] = text
    arts = [plot, table]
    outcome = sweep_outcome(d)
    if outcome in ("too-low", "too-high"):
        return failed(outcome, text, arts, **data)
    if outcome == "none-learns":
        top = max(d)
        if lr * top < usual_lr(probe_opt):   # the highest rate tried is still below what this optimizer usually needs
            data.update(highest_tried=lr * top, usual_lr=usual_lr(probe_opt))
            return cannot_run(f"{text}: no setting moved the loss, but the highest rate tried ({lr * top:.3g}) is still "
                              f"below the {usual_lr(probe_opt):.3g} {type(probe_opt).__name__} usually trains at; a sweep "
                              f"up to that rate would measure whether the rate is too low", **data, reason="not-measured")
        if steps < wanted:  # no setting moved it in the few steps the budget fits: not a finding
            return cannot_run(f"{text}: no setting moved the loss within the {steps} steps the budget fits (of "
                           f"{wanted}); too few to say none learns", **data, reason="budget")
        return failed("none-learns", text, arts, **data)
    return passed(text, artifacts=arts, **data)


ADAPTIVE = ("Adam", "AdamW", "NAdam", "RAdam", "Adamax", "RMSprop", "Adagrad", "Adadelta", "Adafactor", "SparseAdam")


def usual_lr(optimizer) -> float:
    """The low end of the rates an optimizer of this kind usually trains at from scratch: 1e-3 for the adaptive
    ones (Adam's default), 1e-2 for plain SGD and the rest."""
    name = type(optimizer).__name__
    if name == "Adadelta":
        return 0.1
    return 1e-3 if name in ADAPTIVE else 1e-2


def _up(d: dict[float, float]) -> float:
    """The higher factor (above 1) that removed the most loss while staying finite."""
    return max((f for f in d if f > 1 and math.isfinite(d[f])), key=lambda f: d[f], default=10.0)


def sweep_outcome(d: dict[float, float], margin: float = BETTER) -> str:
    """The sweep's verdict from the share of the loss each factor removed (``d[factor]``, -inf when it
    diverged; factors 0.1, 1 and 10 at least): ``too-low``, ``too-high``, ``none-learns`` or ``ok``.
    One rule for the module sweep and the sweep over reruns of a script (probes/intervene.py).
    A direction is named only when its arm is the best of all and ahead of the configured rate by
    ``margin`` (at least BETTER; more where the run's own step-to-step noise is larger, see
    :func:`noise_margin`): a configured rate behind both of its neighbours is noise, not a direction; and
    only when that arm lowered the loss."""
    up = _up(d)
    best = max(d.values())
    # (and only when that arm lowered the loss at all: arms that all ended above their start, one less far, learn
    # nothing between them)
    if d[1.0] < MOVES and math.isfinite(d.get(up, -math.inf)) and d[up] >= d[1.0] + margin and d[up] >= best and d[up] > 0:
        return "too-low"
    if math.isfinite(d[0.1]) and (not math.isfinite(d[1.0]) or d[0.1] >= d[1.0] + margin) and d[0.1] >= best \
            and (d[0.1] > 0 or not math.isfinite(d[1.0])):   # (finite where the configured rate diverged: a direction)
        return "too-high"
    if max(d.values()) < MOVES:
        return "none-learns"
    return "ok"


def noise_margin(arms: list[list[float]], start: float, tail: int, z: float = 2.0) -> float:
    """How far apart two arms' shares of the loss removed must be to differ by more than noise: ``z``
    standard errors of the difference of two means of ``tail`` steps, as a share of ``start``; never below
    BETTER. The noise is the step-to-step noise around the trend of the quietest arm: what the objective
    itself draws at every rate (a diffusion model's per-step loss jumps by ~20% of its level, where a 10%
    margin is a coin toss), not the jumps a rate far too high adds to its own arm."""
    noises = [n for n in (_noise(a)[0] for a in arms) if math.isfinite(n)]
    if not (noises and start > 0 and tail > 0):
        return BETTER
    return max(BETTER, z * min(noises) * math.sqrt(2.0 / tail) / start)


def _noise(losses: list[float]) -> tuple[float, float]:
    """(step-to-step noise around a moving-average trend, progress of that trend)."""
    finite = [l for l in losses if math.isfinite(l)]
    if len(finite) < 8:
        return math.nan, math.nan
    w = max(3, len(finite) // 6)
    trend = [sum(finite[max(0, i - w // 2): i + w // 2 + 1]) / len(finite[max(0, i - w // 2): i + w // 2 + 1])
             for i in range(len(finite))]
    resid = [a - b for a, b in zip(finite, trend)]
    noise = (sum(r * r for r in resid) / len(resid)) ** 0.5
    progress = sum(trend[:w]) / w - sum(trend[-w:]) / w
    return noise, progress


@probe(
    "oscillation",
    title="Loss noise against progress; the effect of lr/3, clipping and a doubled batch",
    outcomes={"ok": "the loss makes steady progress (noise below progress, or it fell 90%)",
              "batch-helps": "a doubled batch (two accumulated batches per step) ends clearly lower than lr/3 or clipping",
              "lr-helps": "lr/3 ends clearly lower than the other remedies",
              "clip-helps": "gradient clipping ends clearly lower than the other remedies",
              "none-helps": "the loss is noisy and no remedy helps clearly"},
    timeout_s=120,
    share=0.25,
    floor=5 * MIN_OSCILLATION + 4,
)
def oscillation(ctx: ProbeContext):
    target = ctx.target
    wanted = int(ctx.param("steps", 200))
    # the run as configured and three remedies (one with a doubled batch), each evaluated 17 times
    steps = ctx.plan_steps(wanted, minimum=MIN_OSCILLATION, runs=5, fixed=4 * (_eval_cost(target, 17) + 1))
    if not steps:
        return ctx.unaffordable(MIN_OSCILLATION, "steps each of its four runs needs", wanted=wanted)
    eval_set = _eval_set(target)
    every = max(1, steps // 16)
    try:
        base = _run(ctx, 1.0, steps, eval_set=eval_set, every=every)
        noise, progress = _noise(base[0])
        start = base[1][0][1]
        # steady: the noise stays below the trend's progress, or the loss already lost 90% of itself
        steady = math.isfinite(base[2]) and ((math.isfinite(noise) and 0 < progress and noise < progress)
                                             or base[2] < 0.1 * start)
        if steady:
            return passed(f"{steps} steps: noise {noise:.3g} around a trend that fell {progress:.3g}; fixed-set loss "
                          f"{start:.4g} -> {base[2]:.4g}", artifacts=[LinePlot(
                              "oscillation-train", "Training loss per step", {"as configured": base[0]})],
                          steps=steps, noise=noise, progress=progress, start_loss=start, final=base[2])
        lr3 = _run(ctx, 1 / 3, steps, eval_set=eval_set, every=every)
        clip = _run(ctx, 1.0, steps, clip=float(ctx.param("max_norm", 1.0)), eval_set=eval_set, every=every)
        batch2 = _run(ctx, 1.0, steps, merge=2, eval_set=eval_set, every=every)
    except Exception as exc:  # noqa: BLE001
        return cannot_run(f"the training step raised: {first_line(exc)}", reason="raised", error=first_line(exc))
    finals = {"lr/3": lr3[2], "clip": clip[2], "2x batch": batch2[2]}
    data = dict(steps=steps, noise=noise, progress=progress, noise_ratio=noise / progress if progress > 0 else math.inf,
                start_loss=start, final=base[2], final_lr3=lr3[2], final_clip=clip[2], final_batch2=batch2[2],
                batch_size=len(target.batch()[1]))
    train_plot = LinePlot("oscillation-train", f"Training loss per step (batch of {data['batch_size']})",
                          {"as configured": base[0]}, logy=False)
    curves = {"as configured": base[1], "lr/3": lr3[1], "clip_grad_norm_": clip[1], "2x batch (accumulated)": batch2[1]}
    xs = sorted({s for c in curves.values() for s, _ in c})
    series = {k: [dict(c).get(x, math.nan) for x in xs] for k, c in curves.items()}
    eval_plot = LinePlot("oscillation-eval", f"Loss on {len(eval_set[1])} fixed samples: remedies from the same weights",
                         series, x=xs)
    arts = [train_plot, eval_plot]

    def fmt(v):
        return f"{v:.4g}" if math.isfinite(v) else "diverged"

    text = (f"{steps} steps: noise {noise:.3g} around a trend that fell {progress:.3g}; fixed-set loss {fmt(start)} -> "
            f"{fmt(base[2])} as configured, {fmt(lr3[2])} at lr/3, {fmt(clip[2])} clipped, {fmt(batch2[2])} with a "
            f"doubled batch")
    data["text"] = text
    finite = {k: v for k, v in finals.items() if math.isfinite(v)}
    ref = base[2] if math.isfinite(base[2]) else math.inf
    if steps < wanted:
        data["wanted_steps"] = wanted
    if not finite:
        return failed("none-helps", text, arts, **data)
    best = min(finite, key=finite.get)
    others = [v for k, v in finite.items() if k != best]
    # clearly: 10% below the loss as configured, and 5% below every other remedy
    data.update(best=best, best_final=finite[best], gain=(1 - finite[best] / ref) if math.isfinite(ref) else 1.0)
    clearly = finite[best] < ref * (1 - BETTER) and all(finite[best] < v * (1 - BETTER / 2) for v in others)
    if not clearly:
        if steps < wanted:  # no remedy clearly better within the few steps the budget fits: not a finding
            return cannot_run(f"{text}; no remedy clearly better within the {steps} steps the budget fits (of {wanted})", **data, reason="budget")
        return failed("none-helps", text, arts, **data)
    return failed({"lr/3": "lr-helps", "clip": "clip-helps", "2x batch": "batch-helps"}[best], text, arts, **data)
