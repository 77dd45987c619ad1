"""Counterfactual probes through the user's own script (script mode, CONTRACT §6, issue #10 item 4).

Each probe re-executes the real script (``ScriptTarget.rerun``: runpy in this process, sandboxed,
bounded) under one intervention and reads the new recording, so the user's own loop, reshaping,
casts and optimizer run exactly as they wrote them:

- ``script-overfit``: the first batch every step (the DataLoader's batches replaced); does the
  script's loss on that one batch go to zero? Judged by the rule module mode uses
  (``sanity.overfit_outcome``).
- ``script-lr-sweep``: the script with every learning rate x0.1 and x10 from the same seed, against
  the observed run as the x1 arm; the share of the loss each removes is judged by the module sweep's
  rule (``lr.sweep_outcome``).
- ``script-determinism``: the script without nnwizard's seeding, and again from the observed run's
  seed: same losses bitwise?
- ``script-nan-bisect``: the script up to its first recorded non-finite step, that step traced op by
  op (``OpTracer``, the tracer nan-bisect uses): the op and the user's file:line that made the first
  NaN/Inf.

Every rerun is planned with ``ctx.plan_steps`` from the observed run's measured step time and its
start-up time (``ScriptTarget.rerun_cost``); each summary says which reruns ran and how many steps.
On a module target every probe here is skipped.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any, Callable

import torch

from nnwizard.probes._objectives import ADVERSARIAL, adversarial_reason, objectives, optimizer_label
from nnwizard.record.optrace import OpTracer
from nnwizard.probes.api import LinePlot, ProbeContext, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.probes.lr import BETTER, MOVES, noise_margin, sweep_outcome
from nnwizard.probes.sanity import overfit_outcome
from nnwizard.probes._recording import fmt
from nnwizard.probes.modes import steady_train_mode

MIN_OVERFIT = 20      # rerun steps below which memorising one batch cannot be told from slow learning
JUDGED_STEPS = 60     # the observed steps whose progress can hold off "too low" (the default observed run's length)
MIN_SWEEP = 10        # steps per learning rate below which the sweep compares noise
STEP_SLACK = 3.0      # a rerun's time limit: this many times its planned cost (plus LIMIT_FLOOR_S)
LIMIT_FLOOR_S = 5.0


def on_script(intervention: Callable[[ProbeContext, Any], Any]) -> Callable[[ProbeContext], Any]:
    """An intervention: called as ``intervention(ctx, script_target)``; skipped on a module target."""
    @functools.wraps(intervention)
    def run(ctx: ProbeContext):
        target = ctx.target
        if getattr(target, "mode", "module") != "script" or not hasattr(target, "rerun"):
            return skipped("script mode only: this probe reruns the user's script")
        return intervention(ctx, target)
    return run


def losses_of(run, objective: int | None = None, skip: set[int] = frozenset()) -> list[float]:
    """The run's loss series: all steps with a backward (one objective), or one optimizer's own steps
    (less the steps numbered in ``skip``)."""
    return [s.loss for s in run.recording.steps if s.loss is not None and (objective is None or s.optimizer == objective)
            and s.step not in skip]


class _Extend:
    """Listener for a rerun asked for ``wanted`` steps but planned at ``planned``: past the plan it
    goes on while ``ctx.more_steps`` says one more step fits the probe's own allowance (the plan priced a
    step at the session's calibration; a rerun's steps may be cheaper), else ends the run. It borrows
    nothing from the probes still to come (the ladder after it needs its share)."""

    def __init__(self, ctx, planned: int, wanted: int, per: float):
        self.ctx, self.planned, self.wanted, self.per = ctx, planned, wanted, per

    def on_step_post(self, rec, optimizer, step) -> None:
        from nnwizard.record import StopRun

        done = int(rec.recording.total_steps / self.per)
        if done >= self.planned and not self.ctx.more_steps(done, self.planned, self.wanted):   # its own allowance only
            raise StopRun(f"{done} steps: no more fit the probe's allowance")


def observed_curves(target):
    """The observed run's objectives, or a skip when they are adversarial (no curve to judge)."""
    objs = objectives(target.recording)
    if objs.adversarial:
        return objs, skipped(adversarial_reason(objs), "adversarial", objectives=objs.text)
    return objs, None


def _limit_s(target, steps: int) -> float:
    step = target.measured_step_s or 0.05
    return STEP_SLACK * (target.startup_s + steps * step) + LIMIT_FLOOR_S


def rerun_script(ctx, target, steps: int, **how):
    """The script rerun for ``steps`` points of each loss series (optimizer steps per point as in the
    observed run: a script stepping two optimizers per backward takes two, and so does one whose two
    optimizers each follow their own backward, a series each)."""
    per = objectives(target.recording).steps_per_point(len(target.recording.steps))
    ctx.progress(0.0, f"rerunning the script ({steps} steps)")
    how.setdefault("seed", ctx.seed)   # the observed run's seed: an arm differs from it by the intervention alone
    return target.rerun(max_steps=max(1, math.ceil(steps * per)), time_limit_s=_limit_s(target, steps), **how)


def _losses_only(run):
    """What the lr sweep reads of a rerun (its step records and the error it raised, if any): the rest of its
    recording (its models, optimizer state, DataLoader and data set, the exception's frames) is let go at once,
    not held through the sweep's later reruns (a script that loads its data in memory holds it once per rerun)."""
    from dataclasses import replace

    from nnwizard.record import Recording

    rec = run.recording
    error = replace(rec.error, exception=None) if rec.error is not None else None
    return replace(run, recording=Recording(steps=rec.steps, error=error, mode=rec.mode, total_steps=rec.total_steps))


def rerun_raised(run) -> str | None:
    err = run.recording.error
    if err is None:
        return None
    return f"{err.type}: {err.message}" + (f" ({err.where})" if err.where else "")


def _accuracy(target, run) -> float | None:
    """Accuracy of the rerun's trained model on the repeated batch, its outputs reshaped as the
    script reshaped them for the loss (classification only; None when it cannot be measured, or when what the
    loss scored is not the output reshaped)."""
    from nnwizard.script_target import ScriptLoss, first_training_call, main_model

    if target.task != "classification" or not isinstance(target.loss_fn, ScriptLoss) or not target.capturable:
        return None
    rec = run.recording
    info, call = main_model(rec), first_training_call(rec)
    inputs = next((a for i, a in rec.model_inputs if info is not None and i == info.index), None)
    if info is None or call is None or not inputs or len(inputs) != 1 or not isinstance(call.targets, torch.Tensor):
        return None
    model = info.module
    try:
        with steady_train_mode(model), torch.no_grad():
            device = next(iter(model.parameters())).device
            out = target.loss_fn.adapt(model(inputs[0].to(device)))
        if not isinstance(out, torch.Tensor) or out.dim() != 2 or len(out) != len(call.targets) \
                or list(out.shape) != list(call.input_shape):   # (scores computed from the output, not the output: a
            return None                                           # contrastive loss's similarities of its features)
        return float((out.argmax(1).cpu() == call.targets.reshape(-1)).float().mean())
    except Exception:  # noqa: BLE001 - a model we cannot call again outside the script: no accuracy
        return None


def _broadcast(call) -> list | None:
    """The shape the loss's input and target broadcast to, when it is larger than both (MSE of a
    (N, 1) prediction against an (N,) target compares every prediction with every target)."""
    if call is None or call.target_shape is None or list(call.input_shape) == list(call.target_shape):
        return None
    try:
        shape = list(torch.broadcast_shapes(tuple(call.input_shape), tuple(call.target_shape)))
    except RuntimeError:
        return None
    return shape if math.prod(shape) > max(math.prod(call.input_shape), math.prod(call.target_shape)) else None


# ------------------------------------------------------------------------------------ overfit
# script-overfit: a loss on one repeated batch that ends above this multiple of its start rose (the tree reads
# the same ratio: trees/script_interventions.yaml, overfit-stuck)
OVERFIT_ROSE = 1.5


@probe(
    "script-overfit",
    title="Overfit one batch through the script itself (its first batch at every step)",
    outcomes={"learns": "the script's loss on its one repeated batch approaches zero",
              "slow": "the loss falls but stays far from zero", "stuck": "the loss does not fall",
              "unchanged": "loss and parameters do not change at all",
              "diverged": "the loss becomes NaN/Inf", "crashed": "the rerun raised", **ADVERSARIAL},
    timeout_s=120,
    share=0.3,
)
@on_script
def script_overfit(ctx: ProbeContext, target):
    rec = target.recording
    if not rec.steps:
        return skipped("the script took no optimizer step to repeat")
    objs, skip = observed_curves(target)
    if skip is not None:
        return skip
    one = target.feeds_one_batch
    repeat = None
    if not rec.loaders and not one:   # slices of its own tensors, get_batch(i), a generator
        info = target.model_info
        if info is None:
            return cannot_run("the script feeds no recorded model whose inputs could be repeated", reason="precondition")
        from nnwizard.record import LOSS_FUNCTIONS
        from nnwizard.script_replace import RepeatFirstStep
        repeat = RepeatFirstStep(info.index, info.name, LOSS_FUNCTIONS)
    wanted = int(ctx.param("steps", 40))
    steps = ctx.plan_steps(wanted, minimum=MIN_OVERFIT, fixed=target.rerun_cost(0))
    if not steps:
        return ctx.unaffordable(MIN_OVERFIT, "rerun steps overfitting one batch needs", wanted=wanted)
    per = objs.steps_per_point(len(rec.steps))
    extend = _Extend(ctx, steps, wanted, per)
    if repeat is not None:
        how = "the first step's model inputs and loss target every step"
        if not any(c.target_shape is not None and not c.eval for c in rec.loss_calls):
            return cannot_run("the script feeds its model without a DataLoader and computes its loss by hand: the "
                              "target of its first step cannot be repeated", reason="precondition")
        run = rerun_script(ctx, target, wanted, listeners=[repeat, extend], patches=[repeat], what=how,
                     limit_batches=max(2 * wanted, 20))
        if not repeat.repeated():
            return cannot_run(f"the script feeds its model without a DataLoader, and its later steps could not all be "
                              f"given the first step's tensors ({repeat.describe()}): the rerun was not one batch "
                              f"repeated", reason="precondition", repeated=repeat.describe())
    else:
        how = "the same first batch every step" if rec.loaders else "its own full batch (it already repeats it)"
        run = rerun_script(ctx, target, wanted, same_batch=bool(rec.loaders), limit_batches=max(2 * wanted, 20),
                     listeners=[extend])
    keys = list(objs.series) if objs.several else [None]
    kept = repeat.kept_steps if repeat is not None else set()   # an epoch's last, shorter slice: another batch
    series = {k: losses_of(run, k, kept) for k in keys}
    losses = min(series.values(), key=len)
    data: dict[str, Any] = dict(steps=len(losses), planned_steps=steps, wanted_steps=wanted, how=how,
                                rerun_seconds=run.seconds, rerun_exit=run.exit, first_step_repeated=repeat is not None)
    error = rerun_raised(run)
    if error is not None and len(losses) < MIN_OVERFIT:
        if not target.run.crashed:   # the script's own run did not raise: the rerun, not the script, failed
            return cannot_run(f"the script rerun with {how} raised after {len(losses)} steps, where its own run did "
                              f"not: {error}", reason="rerun-raised", error=error, **data)
        return failed("crashed", f"the script rerun with {how} raised after {len(losses)} steps: {error}",
                      error=error, **data)
    if len(losses) < MIN_OVERFIT:
        return cannot_run(f"the script rerun with {how} took only {len(losses)} optimizer steps (of {steps} planned): "
                          f"too few to tell memorising from slow learning", reason="precondition", **data)
    updates = [s.update for s in run.recording.steps if s.update is not None]
    moved = max(updates) if updates else None
    shares = sorted(s.update_rel for s in run.recording.steps if s.update_rel is not None)
    step_share = shares[len(shares) // 2] if shares else None   # a step's change as a share of the parameters' size
    accuracy = _accuracy(target, run) if not objs.several else None
    outcomes = {k: overfit_outcome(v, accuracy, moved) for k, v in series.items()}
    judged = next((k for k, o in outcomes.items() if o != "learns"), keys[0])   # each objective must learn its batch
    losses, outcome = series[judged], outcomes[judged]
    if objs.several:
        data.update(objectives=objs.text, judged=optimizer_label(rec, judged),
                    outcomes={optimizer_label(rec, k): o for k, o in outcomes.items()})
        how += f" (judged per optimizer: {optimizer_label(rec, judged)}'s own loss)"
    first, last = losses[0], losses[-1]
    call = target.loss_call
    samples = None
    if call is not None and call.target_shape:
        samples = call.target_shape[0]
    broadcast = _broadcast(call)
    data.update(first_loss=first, final_loss=last, best_loss=min((l for l in losses if math.isfinite(l)), default=math.nan),
                ratio=last / first if first else math.nan, accuracy=accuracy, max_param_change=moved, samples=samples,
                loss_fn=call.fn if call else None, loss_input_shape=call.input_shape if call else None,
                loss_target_shape=call.target_shape if call else None, broadcast=broadcast is not None,
                broadcast_shape=broadcast, update_rel=step_share)
    acc = f", accuracy {accuracy:.0%}" if accuracy is not None else ""
    text = f"{len(losses)} rerun steps of {how}: loss {fmt(first)} -> {fmt(last)}{acc}"
    if step_share is not None and outcome != "learns":   # (how far each step went: too small, or jumping past)
        text += f"; a step changed the parameters by {step_share:.2g} of their size (median of {len(shares)} steps measured)"
    if kept:
        text += f" ({len(kept)} step(s) whose inputs had another shape kept their own and are left out)"
        data["kept_steps"] = len(kept)
    if broadcast is not None and outcome != "learns":
        text += (f"; {call.fn} compares input {call.input_shape} with target {call.target_shape}, which broadcast to "
                 f"{broadcast}: every prediction against every target")
    data["text"] = text
    plot = LinePlot("script-overfit", f"The script on one repeated batch ({len(losses)} steps)", {"loss": losses},
                    logy=all(l > 0 for l in losses if math.isfinite(l)))
    if outcome == "learns":
        return passed(text, "learns", [plot], **data)
    if outcome == "diverged":
        data["nan_step"] = next(i for i, l in enumerate(losses) if not math.isfinite(l)) + 1
        return failed("diverged", f"{text}: non-finite from step {data['nan_step']}", [plot], **data)
    if outcome == "unchanged":
        return failed("unchanged", f"{text}: no parameter changed over {len(losses)} steps", [plot], **data)
    # a loss that rose on its one repeated batch says so after any number of steps (steps too small leave it
    # where it was): only a loss still falling, or flat, needs the full run to be called slow or stuck
    rose = first > 0 and math.isfinite(last) and last > OVERFIT_ROSE * first
    if len(losses) + len(kept) < wanted and broadcast is None and not rose:   # the kept slices ran too
        why = f"the budget fits (of {wanted})" if steps < wanted else f"the script ran (of {steps} planned)"
        return cannot_run(f"{text}: not learnt within the {len(losses)} steps {why}, too few to call it {outcome}",
                          reason="budget" if steps < wanted else "precondition", **data)
    return failed(outcome, text, [plot], **data)


# ------------------------------------------------------------------------------------ lr sweep
def _tail(losses: list[float]) -> float:
    if not losses or not all(math.isfinite(l) for l in losses):
        return math.nan
    k = max(3, len(losses) // 4)
    return sum(losses[-k:]) / len(losses[-k:])


def _removed(start: float, losses: list[float]) -> float:
    """The share of ``start`` a run of ``losses`` removed by its end (_tail); -inf when that is not finite."""
    tail = _tail(losses)
    return (start - tail) / start if math.isfinite(tail) and start > 0 else -math.inf


@probe(
    "script-lr-sweep",
    title="The script with its learning rates x0.1 and x10, from the same seed, against the observed run",
    outcomes={"ok": "the configured learning rate moves the loss and no other setting is clearly better",
              "too-low": "the loss barely moves at lr and clearly falls at lr*10",
              "too-high": "lr diverges or does clearly worse than lr/10",
              "none-learns": "no setting of the learning rate moves the loss", **ADVERSARIAL},
    timeout_s=120,
    share=0.4,
)
@on_script
def script_lr_sweep(ctx: ProbeContext, target):
    manual = not target.recording.optimizers and any(s.manual for s in target.recording.steps)
    if not losses_of(target.run) or not (target.recording.optimizers or manual):
        return skipped("the script took no optimizer step")
    objs, skip = observed_curves(target)
    if skip is not None:
        return skip
    keys = list(objs.series) if objs.several else [None]   # several objectives: each optimizer's own series
    wanted = int(ctx.param("steps", 30))
    shortest = min(len(losses_of(target.run, k)) for k in keys)
    # two reruns (x0.1, x10), a third (x100) when none of them moves the loss; when the observed run blew up within
    # its first updates and then learnt, room for lr/10 over the observed run's judged length too (_sweep_judged)
    fixed = 3 * target.rerun_cost(0)
    long = min(shortest, JUDGED_STEPS) if any(_overshot(losses_of(target.run, k)) for k in keys) else 0
    steps = (long and ctx.plan_steps(min(wanted, shortest), minimum=MIN_SWEEP, runs=3, fixed=fixed + target.rerun_cost(long))) \
        or ctx.plan_steps(min(wanted, shortest), minimum=MIN_SWEEP, runs=3, fixed=fixed)
    if not steps:
        return ctx.unaffordable(MIN_SWEEP, "rerun steps each learning rate needs", wanted=wanted)
    reruns = {}
    for factor in (0.1, 10.0):
        reruns[factor] = _losses_only(rerun_script(ctx, target, steps, lr_scale=factor))
    results = [_sweep_judged(ctx, target, reruns, steps, wanted, k) for k in keys]
    if manual:   # the script's own p -= lr * p.grad: each rerun scaled the gradients its update reads
        for r in results:
            r.summary += "; the script updates its parameters by hand, so each rerun scaled the gradients its update reads"
            r.data["hand_written"] = True
    if objs.several:
        for k, r in zip(keys, results):
            r.summary = f"{optimizer_label(target.recording, k)}'s own loss: {r.summary}"
            r.data.update(objectives=objs.text, judged=optimizer_label(target.recording, k))
    # each objective is judged on its own series: the first that fails (or cannot be measured) speaks
    return next((r for r in results if r.status == "failed"), next((r for r in results if r.status != "passed"), results[0]))


def _blew_up(losses: list[float]) -> bool:
    """The loss rose to SPIKE_BLOWUP times its first value (or went non-finite) within these steps."""
    from nnwizard.curves import SPIKE_BLOWUP

    return len(losses) > 1 and losses[0] > 0 and any(not math.isfinite(x) or x >= SPIKE_BLOWUP * losses[0] for x in losses)


def _overshot(losses: list[float]) -> bool:
    """Within the first third of the judged steps the loss rose to SPIKE_BLOWUP times its first value (the curve
    shapes' early blow-up), and over those steps it ended below that first value: the configured rate overshot, then learnt."""
    window = losses[:JUDGED_STEPS]
    if len(window) < 2 * MIN_SWEEP or not all(math.isfinite(x) for x in window):
        return False
    return _blew_up(window[: len(window) // 3]) and _tail(window) < window[0]


def _warmup(rec, objective: int | None, n: int) -> dict:
    """The observed run's rate over the sweep's window when a schedule was still raising it at the window's end (a
    warm-up not over): ``warmup_rise``, the last rate over the first. The arms scale that schedule, so each compares
    rates the warm-up keeps below their peak. Empty when the rate did not rise 2x or had stopped rising."""
    lrs = [s.lrs[0] for s in rec.steps if s.lrs and (objective is None or s.optimizer == objective)][:n]
    if len(lrs) < 4 or lrs[0] <= 0:
        return {}
    rise, late = lrs[-1] / lrs[0], lrs[(3 * len(lrs)) // 4]
    if rise < 2 or lrs[-1] <= late * 1.05:
        return {}
    return dict(warmup_rise=rise, warmup_from=lrs[0], warmup_to=lrs[-1])


def _sweep_judged(ctx, target, reruns: dict, steps: int, wanted: int, objective: int | None):
    """The sweep's judgement on one loss series (all steps, or one optimizer's own)."""
    observed = losses_of(target.run, objective)
    lr = target.recording.steps[0].lrs[0] if target.recording.steps[0].lrs else None
    if objective is not None:
        own = next((s for s in target.recording.steps if s.optimizer == objective and s.lrs), None)
        lr = own.lrs[0] if own is not None else lr
    runs: dict[float, list[float]] = {1.0: observed[:steps]}
    errors = {}
    for factor in (0.1, 10.0):
        run = reruns[factor]
        runs[factor] = losses_of(run, objective)[:steps]
        if rerun_raised(run):
            errors[factor] = rerun_raised(run)
    # an arm that went non-finite, or whose rerun raised, diverged, however early it stopped
    diverged = {f for f, v in runs.items() if f in errors or not all(math.isfinite(x) for x in v)}
    n = min((len(v) for f, v in runs.items() if f not in diverged), default=0)
    if n < MIN_SWEEP:
        return cannot_run(f"a rerun took only {n} optimizer steps (of {steps} planned)", reason="precondition", steps=n)
    start = observed[0]
    d = {}
    for f, v in runs.items():
        d[f] = -math.inf if f in diverged else _removed(start, v[:n])

    def extra_arm(factor: float) -> None:   # one more rate over the same n steps (a rerun kept for the other objectives)
        if factor not in reruns:
            reruns[factor] = _losses_only(rerun_script(ctx, target, n, lr_scale=factor))
        runs[factor] = losses_of(reruns[factor], objective)[:n]
        d[factor] = _removed(start, runs[factor]) if len(runs[factor]) >= n else -math.inf

    # a short range test, as the module sweep makes: when no setting moved the loss and lr*10 stayed
    # finite, try lr*100
    if max(d.values()) < MOVES and math.isfinite(d[10.0]) and ctx.param("extend", True):
        extra_arm(100.0)
    window = observed[:max(JUDGED_STEPS, 2 * n)]
    margin = noise_margin([v[:n] for f, v in runs.items() if f not in diverged], start, max(3, n // 4))   # (_tail's quarter)
    outcome = sweep_outcome(d, margin)
    whole = _removed(start, window)
    # the same range test downwards: nothing moved, the configured rate threw the loss up (SPIKE_BLOWUP times its
    # start) and never brought it below where it began, and lr/10 did not learn either. A rate 100x too high
    # (Adadelta at 100) leaves lr/10 still far too high: lr/100 is the arm that tells "too high" from "nothing learns"
    if outcome == "none-learns" and whole < MOVES and ctx.param("extend", True) and _blew_up(observed[:n]):
        extra_arm(0.01)
        if d[0.01] >= MOVES and d[0.01] >= max(d[0.1], d[1.0]) + margin:
            outcome = "too-high"
    # nothing moved within the sweep's window, nor over the observed run: a model trained from scratch (a transformer)
    # can sit on its plateau for a few dozen steps at any rate. lr*100 then gets the observed run's whole length,
    # against what the observed run removed over the same steps
    longer = None
    if outcome == "none-learns" and 100.0 in d and whole < MOVES and len(observed) >= n + MIN_SWEEP \
            and ctx.param("extend", True):
        longer = _longer_arm(ctx, target, reruns, observed, objective, 100.0)
        if longer is not None and longer["drop"] >= MOVES and longer["drop"] >= longer["observed_drop"] + _long_margin(longer):
            outcome = "too-low"
    # the sweep's window says "too high" (lr/10 ahead) or that nothing learns, while the observed run, finite
    # throughout, went on to remove clearly more than lr/10 did in that window: the window is too short to judge,
    # and may only show the configured rate's first overshoot (Adam's first steps at 1e-3 throw a wide layer's loss up
    # 2-5x, and it recovers within ten). When the run overshot, lr/10 gets the observed run's whole judged length,
    # against the observed run over the same steps; when that does not fit, nothing is concluded
    recovered = (outcome in ("too-high", "none-learns") and whole >= MOVES and math.isfinite(d[0.1])
                 and len(window) >= n + MIN_SWEEP and all(math.isfinite(x) for x in window) and whole >= d[0.1] + BETTER)
    if recovered and outcome == "none-learns" and not _overshot(window):
        outcome = "ok"       # the configured rate learns over the run; no setting did better within the window
    elif recovered:
        longer = _longer_arm(ctx, target, reruns, window, objective, 0.1) if ctx.param("extend", True) else None
        if longer is None:
            outcome = "unsettled"
        else:
            outcome = "too-high" if longer["drop"] >= longer["observed_drop"] + _long_margin(longer) else "ok"
    count = len(runs) - 1
    # "too low" is about the run, not the sweep's window: the observed run must barely move over all
    # its recorded steps too (a healthy rate is slower than lr*10 over the first few steps)
    # (over the first max(60, 2n) steps: what "barely moves" means must not change with how long the run was watched,
    # and a fast script's ~3 s run gives a 100x-too-low rate hundreds of steps to creep down 27%)
    held = outcome == "too-low" and whole >= MOVES
    if held:
        outcome = "ok"

    def pct(f):
        return f"{d[f]:.0%}" if math.isfinite(d[f]) else "diverged"

    lr_text = (lambda f: f" ({lr * f:.3g})") if lr is not None else (lambda f: "")
    text = (f"{n} steps from the same seed ({count} reruns; x1 is the observed run), share of the loss {fmt(start)} "
            f"removed: " + (f"lr/100{lr_text(0.01)} {pct(0.01)}, " if 0.01 in d else "")
            + f"lr/10{lr_text(0.1)} {pct(0.1)}, lr{lr_text(1.0)} {pct(1.0)}, lr*10{lr_text(10.0)} {pct(10.0)}"
            + (f", lr*100{lr_text(100.0)} {pct(100.0)}" if 100.0 in d else ""))
    if margin > BETTER:
        text += f"; differences under {margin:.0%} are within this run's step-to-step noise"
    if held:
        text += (f"; lr*10 is faster over these {n} steps, but the observed run removed {whole:.0%} of the loss over "
                 f"its {'first ' if len(window) < len(observed) else ''}{len(window)} steps at lr")
    if longer is not None:
        arm = "lr*100" if longer["factor"] == 100.0 else "lr/10"
        text += (f"; over the observed run's {'first ' if longer['steps'] < len(observed) else ''}{longer['steps']} steps "
                 f"{arm}{lr_text(longer['factor'])} removed {longer['drop']:.0%}, the configured lr {longer['observed_drop']:.0%}")
    elif recovered:
        text += (f"; {'lr/10 is ahead' if d[0.1] >= d[1.0] + BETTER else 'little moves'} over these {n} steps, but the "
                 f"observed run went on to remove {whole:.0%} over its {len(window)} steps at lr"
                 + (", and lr/10 over as many steps did not fit the time left" if outcome == "unsettled" else ""))
    data = dict(lr=lr, steps=n, drop_observed=whole, observed_steps=len(observed), planned_steps=steps, wanted_steps=wanted, start_loss=start, drop_lr10=d[0.1],
                drop_lr=d[1.0], drop_lrx10=d[10.0], drop_lrx100=d.get(100.0), drop_lr100=d.get(0.01), reruns=count, errors=errors, text=text, moves=MOVES, better=BETTER,
                margin=margin)
    if lr is not None:
        data.update(lr_low=lr * 0.1, lr_high=lr * 10, best_lr=lr * max(d, key=lambda f: d[f]))
    data.update(_warmup(target.recording, objective, n))
    if longer is not None:
        data.update(long_steps=longer["steps"], long_factor=longer["factor"], drop_long_observed=longer["observed_drop"],
                    **{"drop_long_lrx100" if longer["factor"] == 100.0 else "drop_long_lr10": longer["drop"]})
        if outcome == "too-low" and lr is not None:
            data["best_lr"] = lr * 100.0
    series = {f"lr x{f:g}": v for f, v in sorted(runs.items())}
    rows = [[f"x{f:g}{lr_text(f)}", f"{n}", fmt(_tail(runs[f][:n])), pct(f)] for f in sorted(runs)]
    if longer is not None:   # the long arm against the observed run over the same steps, beside the window's arms
        f, k = longer["factor"], longer["steps"]
        series.update({f"lr x{f:g}, {k} steps": longer["losses"], f"lr x1 (observed), {k} steps": longer["observed"]})
        rows += [[f"x{f:g}{lr_text(f)}", f"{k}", fmt(_tail(longer["losses"])), f"{longer['drop']:.0%}"],
                 [f"x1 (observed){lr_text(1.0)}", f"{k}", fmt(_tail(longer["observed"])), f"{longer['observed_drop']:.0%}"]]
    longest = max(len(v) for v in series.values())
    shown = [x for v in series.values() for x in v if math.isfinite(x)]
    plot = LinePlot("script-lr-sweep", "The script's training loss at lr/10, lr (observed) and lr*10",
                    {name: [x if math.isfinite(x) else math.nan for x in v] + [math.nan] * (longest - len(v))
                     for name, v in series.items()},
                    # a blown-up arm (lr*10 at 170) would flatten the others on a linear axis
                    logy=bool(shown) and min(shown) > 0 and max(shown) > 10 * min(shown))
    table = Table("script-lr-sweep", "Learning-rate reruns", ["lr", "steps", "loss at the end (mean of the last steps)",
                                                                "share removed"],
                  rows, marked=[sorted(runs).index(max(d, key=lambda f: d[f]))])
    if outcome in ("too-low", "too-high"):
        return failed(outcome, text, [plot, table], **data)
    if outcome == "unsettled":
        return cannot_run(text, reason="budget", **data)
    if outcome == "none-learns":
        if n < wanted:
            return cannot_run(f"{text}: no setting moved the loss within the {n} steps the budget fits (of {wanted})",
                              reason="budget", **data)
        return failed("none-learns", text, [plot, table], **data)
    return passed(text, artifacts=[plot, table], **data)


def _long_margin(longer: dict) -> float:
    """The noise margin between a long arm and the observed run over the same steps (see noise_margin)."""
    return noise_margin([longer["observed"], longer["losses"]], longer["observed"][0], max(3, longer["steps"] // 4))


def _longer_arm(ctx, target, reruns: dict, observed: list[float], objective: int | None, factor: float) -> dict | None:
    """A rerun at lr*factor for as many steps as ``observed`` (when the time left fits it): the share of the
    loss it removed and the share the observed run removed over the same steps; None when it cannot tell."""
    steps = len(observed)
    key = f"x{factor:g}-long"
    run = reruns.get(key)   # several objectives: one rerun serves each one's series
    if run is None:
        need = target.rerun_cost(steps) * (target.measured_step_s or 0.0)
        # lr*100 within this probe's allowance: the ladder after it (when nothing learns) needs its own share; lr/10
        # (the run learns: no ladder follows) within the session's time left
        spent = time.monotonic() - ctx.started
        if factor == 100.0:
            fits = ctx.time_left() >= 1.5 * need + 2 and (ctx.allowance_s is None or spent + need <= ctx.allowance_s)
        else:
            budget = ctx.budget
            allowed = budget is None or need <= budget.spare() or budget.stretch(need)   # a verdict on the observed run
            if allowed and budget is not None:
                ctx.extend_deadline(need)
            fits = allowed and ctx.time_left() >= need + 2
        if not fits:
            return None
        run = reruns[key] = _losses_only(rerun_script(ctx, target, steps, lr_scale=factor))
    losses = losses_of(run, objective)[:steps]
    if len(losses) < steps or rerun_raised(run):
        return None
    start, tail, mine = observed[0], _tail(losses), _tail(observed)
    if not (start > 0 and math.isfinite(tail) and math.isfinite(mine)):
        return None
    return dict(steps=steps, factor=factor, drop=(start - tail) / start, observed_drop=(start - mine) / start,
                losses=losses, observed=observed[:steps])


# ------------------------------------------------------------------------------------ determinism
@probe(
    "script-determinism",
    title="The script run twice: without nnwizard's seed, and from the observed run's seed",
    outcomes={"ok": "run as the user runs it, the script repeats the observed losses bitwise (it seeds itself)",
              "unseeded": "runs differ unless nnwizard seeds them: the script does not seed its generators",
              "nondeterministic": "even from the same seed two runs give different losses",
              "crashed": "a rerun raised"},
    timeout_s=90,
    share=0.2,
)
@on_script
def script_determinism(ctx: ProbeContext, target):
    from nnwizard.probes.determinism import seeding_notes

    observed = losses_of(target.run)
    if len(observed) < 2:
        return skipped("the script took fewer than 2 optimizer steps to compare")
    wanted = min(int(ctx.param("steps", 5)), len(observed))
    steps = ctx.plan_steps(wanted, minimum=2, runs=2, fixed=2 * target.rerun_cost(0))
    if not steps:
        return ctx.unaffordable(2, "rerun steps a comparison needs", wanted=wanted)
    unseeded, draws, seeds_globals = seeding_notes(target.script.files)
    data: dict[str, Any] = dict(steps=steps, seed=ctx.seed, seeds_globals=seeds_globals, unseeded=unseeded[:6],
                                global_draws=draws[:6], observed=observed[:steps])
    plain = rerun_script(ctx, target, steps, seed=None)
    if rerun_raised(plain):
        return cannot_run(f"the rerun without a seed raised: {rerun_raised(plain)}", "crashed", reason="raised",
                          error=rerun_raised(plain))
    a = losses_of(plain)[:steps]
    data["unseeded_run"] = a
    if a == observed[:steps]:
        return passed(f"the script rerun without nnwizard's seed repeats the observed {steps} losses bitwise: it seeds "
                      f"itself (1 rerun of {steps} steps)", **data)
    seeded = rerun_script(ctx, target, steps, seed=ctx.seed)
    if rerun_raised(seeded):
        return cannot_run(f"the seeded rerun raised: {rerun_raised(seeded)}", "crashed", reason="raised", error=rerun_raised(seeded))
    b = losses_of(seeded)[:steps]
    data["seeded_run"] = b
    diff = next((i + 1 for i, (x, y) in enumerate(zip(a, observed)) if x != y), None)
    data["first_loss_diff"] = diff
    rows = [["none (as the user runs it)", "no" if a != observed[:steps] else "yes", ", ".join(fmt(x) for x in a[:4])],
            [f"torch, random, numpy: {ctx.seed}", "yes" if b == observed[:steps] else "no", ", ".join(fmt(x) for x in b[:4])]]
    table = Table("script-determinism", f"The script's first losses against the observed run ({', '.join(fmt(x) for x in observed[:4])})",
                  ["seeded by nnwizard", "identical", "losses"], rows)
    where = "; ".join(unseeded[:3] + draws[:2])
    data["where"] = where or "the script draws from torch / random / numpy without a seed of its own"
    if b == observed[:steps]:
        return failed("unseeded", f"2 reruns of {steps} steps: without a seed the losses differ from step {diff} "
                      f"({fmt(a[diff - 1]) if diff and diff <= len(a) else '?'} vs {fmt(observed[diff - 1]) if diff else '?'}); "
                      f"seeded as the observed run, they repeat it bitwise: the script never seeds its generators"
                      + (f" ({where})" if where else ""), [table], **data)
    bdiff = next((i + 1 for i, (x, y) in enumerate(zip(b, observed)) if x != y), None)
    data["seeded_diff"] = bdiff
    return failed("nondeterministic", f"2 reruns of {steps} steps: even from the observed run's seed the losses differ "
                  f"from step {bdiff}: a source nnwizard's seed does not reach (a time- or OS-based seed, "
                  f"nondeterministic kernels)" + (f"; {where}" if where else ""), [table], **data)


# ------------------------------------------------------------------------------------ nan bisect
def first_nonfinite_step(rec) -> int | None:
    """The 1-based optimizer step whose loss or gradient was first non-finite, else None."""
    for s in rec.steps:
        if (s.loss is not None and not math.isfinite(s.loss)) or s.grads_nonfinite:
            return s.step
    return None


class _StepTracer:
    """Recorder listener: traces ops only during optimizer step ``step`` of a rerun (forward, loss,
    backward and the update), naming them by the model's modules."""

    def __init__(self, tracer: OpTracer, step: int):
        self.tracer, self.step = tracer, step
        tracer.enabled = step == 1

    def on_forward(self, rec, info, args):
        self.tracer.attach(info.module)

    def on_step_pre(self, rec, optimizer, step):
        self.tracer._in_step = True

    def on_step_post(self, rec, optimizer, step):
        self.tracer._in_step = False
        self.tracer._forward_done = False
        self.tracer.enabled = step.step == self.step - 1


@probe(
    "script-nan-bisect",
    title="The script rerun to its first non-finite step, that step traced op by op",
    outcomes={"inputs": "the failing step's model inputs already held NaN/Inf",
              "forward": "an op inside the model created the first NaN/Inf", "loss": "the loss computation created it",
              "backward": "forward and loss were finite; a backward op created it",
              "update": "gradients were finite; the optimizer step made the parameters non-finite",
              "unlocated": "the traced rerun of that step stayed finite", "crashed": "the rerun raised first"},
    timeout_s=120,
    share=0.2,
)
@on_script
def script_nan_bisect(ctx: ProbeContext, target):
    import warnings

    rec = target.recording
    bad = first_nonfinite_step(rec)
    if bad is None:
        return skipped("every recorded loss and gradient norm was finite")
    grads = [s.grad_norm for s in rec.steps[:bad] if s.grad_norm is not None]
    data: dict[str, Any] = dict(step=bad, losses=[s.loss for s in rec.steps[:bad]],
                                grad_growth=(grads[-2] / grads[0]) if len(grads) > 1 and grads[0] and math.isfinite(grads[-2]) else 1.0)
    if rec.steps[bad - 1].nonfinite_input:
        data.update(phase="inputs")
        return failed("inputs", f"step {bad}: the model's inputs already held NaN/Inf before any op ran (recorded)", **data)
    wanted = bad
    steps = ctx.plan_steps(wanted, minimum=bad, cost=1.0, fixed=target.rerun_cost(0) + 2)
    if not steps:
        return ctx.unaffordable(bad, "rerun steps reaching the first non-finite one need", wanted=wanted)
    tracer = OpTracer(None, files=target.script.files, backward=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with tracer as trace:
            ctx.progress(0.0, f"rerunning the script to step {bad}")
            run = target.rerun(max_steps=bad, time_limit_s=_limit_s(target, bad), listeners=[_StepTracer(tracer, bad)],
                               seed=ctx.seed)
    data.update(rerun_seconds=run.seconds, rerun_steps=len(run.recording.steps), ops_traced=trace.count)
    rec2, phase = trace.first_nonfinite_phase()
    if phase == "backward":
        data["backward_node"] = trace.backward_node
    if phase is None and rerun_raised(run) and len(run.recording.steps) < bad - 1:
        return cannot_run(f"the rerun raised before step {bad}: {rerun_raised(run)}", "crashed", reason="raised",
                          error=rerun_raised(run), **data)
    data["phase"] = phase or "unlocated"
    if rec2 is not None:
        data.update(op=rec2.op, layer=rec2.module or "(outside the model)", where=rec2.where or "?", min_abs=rec2.min_abs,
                    max_abs_in=rec2.max_abs_in, op_text=rec2.describe(), unsafe_op=rec2.min_abs is not None,
                    zero_input=rec2.min_abs is not None and (rec2.min_abs <= 1e-30 or rec2.negative))
        arts = [Table("script-nan-bisect", f"Rerun of step {bad}: ops with non-finite outputs (first 12)",
                      ["#", "op", "phase", "module", "where", "non-finite input"],
                      [[r.index, r.op, r.phase, r.module or "-", r.where or "?", r.nonfinite_in]
                       for r in trace.records if r.nonfinite_out][:12], marked=[0])]
    else:
        data.update(op="?", where="?", zero_input=False, unsafe_op=False, op_text="?")
        arts = []
    head = f"the script rerun to step {bad} (1 rerun, {len(run.recording.steps)} steps, {trace.count} ops traced at step {bad})"
    big = f"; largest |input| {rec2.max_abs_in:.3g}" if rec2 is not None and rec2.max_abs_in is not None else ""
    if phase == "forward":
        return failed("forward", f"{head}: the first NaN/Inf was made by {rec2.describe()} in the forward pass{big}", arts, **data)
    if phase == "loss":
        return failed("loss", f"{head}: the first NaN/Inf was made by {rec2.describe()} after the model's forward{big}", arts, **data)
    if phase == "backward":
        return failed("backward", f"{head}: forward and loss finite; the backward of {rec2.describe()} "
                      f"({data.get('backward_node')}) turned finite gradients into NaN/Inf", arts, **data)
    if phase == "update":
        return failed("update", f"{head}: gradients finite; the optimizer step made the parameters non-finite "
                      f"({rec2.describe()})", arts, **data)
    return failed("unlocated", f"{head}: the traced step stayed finite", arts, **data)

