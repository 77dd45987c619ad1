"""Auto-triage: measure the symptom instead of asking for it.

``triage-run`` trains a fresh model for a short, time-calibrated run through the user's own loop
(``train_epoch`` where given, else ``train_step``, else the reference), records the training loss of
every step and the validation loss (and accuracy) after every epoch through the user's own
``evaluate``, and reads the shape of those curves with :mod:`nnwizard.curves`. The shape becomes
CONTRACT §2 symptoms in ``data["symptoms"]``; the triage tree ``follow``s them, so the expensive
trees run only for what was measured.
"""

from __future__ import annotations

import copy
import math
import time
import traceback

import torch

from nnwizard.curves import Curves, classify
from nnwizard.probes._crash import error_kind
from nnwizard.record.frames import first_line, user_frame
from nnwizard.probes.api import LinePlot, ProbeContext, failed, passed, probe
from nnwizard.reference import as_float
from nnwizard import reference
from nnwizard.target import user_source_files


MIN_STEPS = 12  # the fewest steps whose curve has a shape (the run's own floor)


class LossRecorder:
    """Wraps the loss function handed to the user's loop and records every training-mode value, so a
    ``train_epoch`` that only returns an epoch mean still yields a per-step curve."""

    def __init__(self, fn):
        self.fn, self.values = fn, []

    def __call__(self, *args, **kwargs):
        out = self.fn(*args, **kwargs)
        if torch.is_grad_enabled():
            try:
                self.values.append(as_float(out))
            except Exception:  # noqa: BLE001 - a loss we cannot read is simply not recorded
                pass
        return out

    def __getattr__(self, name):
        return getattr(self.fn, name)


def _from_scheduler(exc: BaseException) -> bool:
    """True when the exception was raised inside torch's LR scheduler (e.g. OneCycleLR stepped past
    its total_steps because this run is longer than the user's schedule): the end of the schedule,
    not a crash of the user's training."""
    return any("lr_scheduler" in (f.filename or "") for f in traceback.extract_tb(exc.__traceback__))


def _metrics(result) -> tuple[float | None, float | None]:
    if isinstance(result, dict):
        loss = result.get("loss")
        if loss is None:
            loss = next((v for k, v in result.items() if "loss" in str(k).lower()), None)
        acc = next((v for k, v in result.items() if str(k).lower() in ("accuracy", "acc", "val_accuracy", "val_acc")), None)
        acc = None if acc is None else float(acc)
        if acc is not None and acc > 1:  # a percentage (metric-audit checks which); above 100 it is no accuracy
            acc = acc / 100 if acc <= 100 else None
        return (None if loss is None else float(loss)), acc
    return (None if result is None else float(result)), None


def run_curves(ctx: ProbeContext, budget_s: float, max_epochs: int, max_steps: int, val_batches: int,
               hard: bool = False, extend=None):
    """Train a fresh model through the user's loop; returns a dict of series and bookkeeping. With
    ``hard`` the run also stops between steps once ``budget_s`` has passed (a budgeted session).
    ``extend(out, spent)``, asked when the planned epochs are done, returns the seconds of one more
    epoch it grants (0: none)."""
    target = ctx.target
    model = target.fresh_model(ctx.seed)
    optimizer = target.make_optimizer(model)
    scheduler = target.make_scheduler(optimizer)
    n_train = len(target.train_loader)
    user_epoch, user_step = target.user_train_epoch, target.user_train_step
    step_fn = user_step or reference.train_step
    loop = "train_epoch" if user_epoch else "train_step" if user_step else "the reference loop"
    out = {"train": [], "epoch_means": [], "val": [], "val_acc": [], "val_steps": [], "loop": loop,
           "error": None, "epochs": 0, "stopped": None}

    def validate(at_step: int) -> None:
        loader = target.subset_loader("val", val_batches)  # its dataset is what it iterates
        if loader is None:
            return
        try:
            loss, acc = _metrics(target.evaluate(model, loader))
        except Exception as exc:  # noqa: BLE001 - a raising evaluate is recorded, training goes on
            out["val_error"] = first_line(exc)
            return
        if loss is not None:
            out["val"].append(loss)
            out["val_acc"].append(acc)
            out["val_steps"].append(at_step)

    # calibration: time one epoch-sized chunk (at most 4 batches) to size the run to the budget
    started = time.monotonic()
    validate(0)
    model.train()
    batches_per_epoch = n_train
    if hard and n_train * 6 > max_steps:  # planned: six epochs or more from the first one on
        batches_per_epoch = max(2, max_steps // 6)
    epochs = max_epochs
    files = user_source_files(target)
    recorder = LossRecorder(target.loss_fn)
    for epoch in range(max_epochs):
        loader = target.loader("train", max_batches=batches_per_epoch)
        recorder.values = []
        t0 = time.monotonic()
        try:
            if user_epoch:
                mean = as_float(user_epoch(model, loader, recorder, optimizer, scheduler))
                values = list(recorder.values) or [mean]
            else:
                values = []
                for batch in loader:
                    if hard and values and time.monotonic() - started > budget_s:
                        break
                    before = len(recorder.values)
                    value = step_fn(model, batch, recorder, optimizer)
                    v = as_float(value) if value is not None else (recorder.values[-1] if len(recorder.values) > before else math.nan)
                    values.append(v)
                    if not math.isfinite(v):
                        break
                if scheduler is not None:
                    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                        scheduler.step(sum(values) / max(len(values), 1))
                    else:
                        scheduler.step()
                mean = sum(values) / max(len(values), 1)
        except Exception as exc:  # noqa: BLE001 - the user's loop raising is a measurement
            if scheduler is not None and _from_scheduler(exc) and out["epochs"] > 0:
                out["stopped"] = f"the scheduler ended its schedule after {out['epochs']} epochs ({first_line(exc)})"
                break
            out["error"] = dict(error=first_line(exc), kind=error_kind(exc), where=user_frame(exc, files),
                                step=len(out["train"]) + len(recorder.values), epoch=epoch)
            break
        out["train"] += values
        out["epoch_means"].append(mean)
        out["epochs"] = epoch + 1
        validate(len(out["train"]))
        model.train()
        if any(not math.isfinite(v) for v in values):
            break
        if epoch == 0:
            # calibrate: how many epochs (and batches per epoch) fit the budget, at least 6 epochs
            # so that a validation curve has a shape, and at most max_steps optimiser steps
            took = max(time.monotonic() - t0, 1e-4)
            per_step = took / max(len(values), 1)
            # the time budget only shortens runs of slow models: below budget/max_steps per step the
            # plan is always max_steps, so the measurement does not depend on machine load
            steps = max(12, min(max_steps, int((budget_s - (time.monotonic() - started)) / per_step)))
            if n_train * 6 > steps:
                batches_per_epoch = max(2, steps // 6)
            epochs = min(max_epochs, 1 + max(5, steps // max(batches_per_epoch, 1)))
        if extend is not None and out["epochs"] >= epochs and epoch + 1 < max_epochs:
            granted = extend(out, time.monotonic() - started)
            if granted:
                budget_s, epochs = max(budget_s, time.monotonic() - started) + granted, epochs + 1
        if out["epochs"] >= epochs or ctx.time_left() < 2 or time.monotonic() - started > (1.0 if hard else 1.5) * budget_s:
            break
        ctx.progress(out["epochs"] / epochs, f"epoch {out['epochs']} loss {mean:.4g}")
    out["seconds"] = round(time.monotonic() - started, 2)
    out["batches_per_epoch"] = batches_per_epoch
    out["model"] = model
    return out


def _fixed(target, val_batches: int) -> float:
    """The run's work besides its steps, in its own steps: two fresh models and seven validation
    passes (a forward costs about a third of a step)."""
    return 3 + 7 * _batches_read(target, val_batches) / 3


def _own_batch(ctx: ProbeContext, wanted: int, val_batches: int):
    """(the unsliced target, one of its steps in the session's steps) when the session slices dear
    batches but the user's own batch goes through more samples a second than the slice and still fits
    a curve's minimum; None otherwise. A learning curve is read in steps but learnt from samples: a
    model whose step costs about the same at any batch (per-layer call overhead) sees a quarter of
    the data on 16-sample slices, and its curve looks stalled where the user's own is falling."""
    from nnwizard.budget import plan_steps

    budget, target = ctx.budget, ctx.target
    if not target.sample_limit or budget is None or not (budget.user_step_s and budget.step_s and budget.user_batch
                                                         and budget.batch):
        return None
    if budget.user_batch / budget.user_step_s <= budget.batch / budget.step_s:
        return None
    own = copy.copy(target)
    own.sample_limit = None
    price = budget.user_step_s / budget.step_s
    if plan_steps(budget, ctx.allowance_s, wanted, MIN_STEPS, cost=price, fixed=_fixed(own, val_batches) * price) < MIN_STEPS:
        return None
    return own, price


def _batches_read(target, val_batches: int) -> int:
    """The batches one validation pass really reads: at most ``val_batches``, fewer when the split
    is smaller (a validation set of four batches costs four, not eight, per pass), none without one."""
    loader = target.subset_loader("val", val_batches)
    if loader is None:
        return 0
    try:
        return min(val_batches, len(loader))
    except TypeError:  # an iterable dataset: its length is unknown, price the passes in full
        return val_batches


UNMOVED = ("stalled-high", "flat")  # shapes a cut run of a slow starter also has: not moved (enough) yet


class _Extension:
    """When the budget cut the run and its curve looks stalled high or flat, one more epoch at a time
    (up to the wanted steps), to tell a standstill from a slow start: a short run of a slowly learning
    model looks stalled or flat (a 3k-parameter CNN was flat after 28 steps, stalled after 35 and
    falling after 70), and the trees those symptoms queue cost hundreds of steps. Each epoch is priced as
    the run's epochs so far cost; the extension takes at most ``LEND`` of what the session has left
    beyond this probe's allowance and the smallest runs of the probes still to come."""

    def __init__(self, ctx: ProbeContext, wanted: int, reference: float | None):
        from nnwizard.budget import LEND

        budget = ctx.budget
        self.ctx, self.wanted, self.reference, self.epochs = ctx, wanted, reference, 0
        self.room = LEND * max(0.0, budget.spare() - ctx.allowance_s - budget.keep_s(budget.spare()))

    def __call__(self, out: dict, spent: float) -> float:
        if len(out["train"]) >= self.wanted or not out["epochs"]:
            return 0.0
        shape = classify(Curves(train=out["train"], val=out["val"] or None, val_steps=out["val_steps"] or None),
                         self.reference)
        need = spent / out["epochs"]
        if shape.shape not in UNMOVED or need > self.room:
            return 0.0
        self.room -= need
        self.epochs += 1
        end = max(self.ctx.deadline or 0.0, time.monotonic() + 1.25 * need + 3)  # the safety net moves, never past the cap
        self.ctx.deadline = end if self.ctx.cap is None else min(self.ctx.cap, end)
        return need


CURVE_OUTCOMES = {  # the shapes of a loss curve; triage-run and trace-run (script mode) both return them
    "ok": "the curves look normal (still falling, or fell and levelled off)",
    "nan": "the loss became NaN/Inf without a healthy phase before it",
    "diverged": "the loss trained well, then blew up at one step",
    "flat": "the loss does not move",
    "oscillating": "the loss jumps around without progress",
    "overfitting": "train loss falls while validation loss rises",
    "stalled-high": "train and validation losses both stall high",
    "slow-high": "still falling, but at the end both losses are above half the chance-level loss",
    "unbounded": "the loss is below zero and falls faster and faster: it has no lower bound",
    "spiked": "the loss blew up within the first updates, then fell: the run first had to undo them",
}


@probe(
    "triage-run",
    title="Short calibrated run of the user's loop; the shape of its train/validation curves",
    outcomes={**CURVE_OUTCOMES, "crashed": "the user's loop raised"},
    timeout_s=60,
    share=0.3,
    floor=MIN_STEPS + 3 + 7 * 8 / 3,  # its minimum, two fresh models and seven validation passes (see below)
)
def triage_run(ctx: ProbeContext):
    budget = float(ctx.param("budget_s", 5.0))
    wanted = int(ctx.param("steps", 300))
    val_batches = int(ctx.param("val_batches", 8))
    own = _own_batch(ctx, wanted, val_batches)
    price = 1.0  # one step of the run in the session's steps
    if own is not None:  # the user's own batch: the curve the user would see, and more samples a second
        ctx.target, price = own
    elif ctx.target.sample_limit:  # sliced batches: fewer validation samples per pass, too
        val_batches = min(val_batches, 4)
    target = ctx.target
    # seven validation passes (a forward costs about a third of a step) and two fresh models
    planned = ctx.plan_steps(wanted, minimum=MIN_STEPS, cost=price, fixed=_fixed(target, val_batches) * price)
    if not planned:
        return ctx.unaffordable(MIN_STEPS, "steps a curve needs (no symptom measured)", wanted=wanted)
    cut = planned < wanted
    if cut and ctx.allowance_s is not None:
        budget = max(budget, 0.9 * ctx.allowance_s)
    batch = target.batch()
    expected = target.expected_initial_loss(batch[1]) if batch is not None else None
    reference_loss = expected[0] if expected else None
    extension = _Extension(ctx, wanted, reference_loss) if cut and ctx.allowance_s is not None else None
    data = run_curves(ctx, budget, int(ctx.param("epochs", 40)), planned, val_batches, hard=cut, extend=extension)
    data.pop("model")  # the trained model is not part of the result
    train, val = data["train"], data["val"]
    info = dict(loop=data["loop"], epochs=data["epochs"], steps=len(train), wanted_steps=wanted, planned_steps=planned,
                seconds=data["seconds"],
                batches_per_epoch=data["batches_per_epoch"], train=[round(v, 6) for v in train],
                val=[round(v, 6) for v in val], val_steps=data["val_steps"],
                val_accuracy=[a for a in data["val_acc"] if a is not None], reference=reference_loss,
                reference_how=expected[1] if expected else None)
    if data.get("val_error"):
        info["val_error"] = data["val_error"]
    if data.get("stopped"):
        info["stopped"] = data["stopped"]
    info["val_loss_final"] = val[-1] if val else None
    if own is not None:
        info["own_batch"] = True  # the session slices dear batches; this run kept the user's (_own_batch)
    if extension is not None and extension.epochs:
        ctx.plan["extended_to"] = len(train)
        info["extended_epochs"] = extension.epochs
    if data["error"]:
        err = data["error"]
        info.update(err, symptoms=["crash"], shape="crashed", training_raised=True)
        where = f" ({err['where']})" if err["where"] else ""
        plot = LinePlot("curves", f"Triage: {len(train)} steps of {data['loop']} before it raised", {"train": train})
        return failed("crashed", f"{data['loop']} raised at step {err['step']}: {err['error']}{where}", [plot], **info)
    shape = classify(Curves(train=train, val=val or None, val_steps=data["val_steps"] or None), reference_loss)
    symptoms = list(shape.symptoms)
    # Still high after the calibrated run: a learnable task takes a healthy small model far below the
    # chance-level loss within a few hundred steps. Ending above half of it (validation too) is the
    # "both stall high" symptom even while the curve still creeps down; the generalization tree then
    # decides with a controlled experiment (capacity-check) whether anything is actually wrong.
    still_high = False
    if cut:  # a run the budget shortened says nothing about where the loss would level off
        info["level_note"] = f"{len(train)} of {wanted} steps (budget): too short to judge how high the loss levels off"
    elif shape.shape in ("falling", "plateau") and reference_loss and train:
        level = shape.data.get("end", math.nan) / reference_loss
        vlevel = (val[-1] / reference_loss) if val else level
        if level > 0.5 and vlevel > 0.5:
            still_high = True
            symptoms.append("underfitting")
            info.update(level=round(level, 4), val_level=round(vlevel, 4))
    info.update(shape=shape.shape, shape_title=shape.title, shape_evidence=shape.evidence, intervention=shape.intervention,
                lr_advice=shape.lr, symptoms=symptoms, **{k: v for k, v in shape.data.items() if k not in info})
    if shape.step is not None:
        info["event_step"] = shape.step
    if val and train:
        info["gap"] = val[-1] - sum(train[-max(1, len(train) // 10):]) / max(1, len(train) // 10)
    if data["val_acc"] and data["val_acc"][-1] is not None:
        info["val_accuracy_final"] = data["val_acc"][-1]
    if len(data["val_acc"]) > 1 and data["val_acc"][1] is not None:  # [0] is before any training
        info.update(val_accuracy_first_epoch=data["val_acc"][1], first_epoch_steps=data["val_steps"][1])
    plots = [_plot(train, val, data["val_steps"], data["loop"], shape)]
    ref = f" (reference {reference_loss:.4g}: {info['reference_how']})" if reference_loss else ""
    ran = f"{len(train)} steps" + (f" (of {wanted} wanted; the budget fits {planned})" if cut else "")
    if own is not None:
        ran += " at your own batch (it learns from more samples a second than the probes' slices)"
    if info.get("extended_epochs"):
        ran += f" (extended by {info['extended_epochs']} epochs while the curve looked stalled)"
    text = f"{ran} / {data['epochs']} epochs of {data['loop']} in {data['seconds']} s: {shape.title}: {shape.evidence}{ref}"
    if still_high:
        return failed("slow-high", f"{text}; after the whole run the loss is still at {info['level']:.0%} of the "
                      f"reference (validation {info['val_level']:.0%})", plots, **info)
    if shape.normal:
        return passed(text, "ok", plots, **info)
    return failed(shape.shape, text, plots, **info)


def _plot(train, val, val_steps, loop, shape) -> LinePlot:
    logy = bool(train) and all(v > 0 for v in train + val if math.isfinite(v))
    label = {"overfitting": "best validation", "nan": "non-finite", "diverged": "diverged"}.get(shape.shape, shape.shape)
    marks = {f"{label} @ {shape.step}": float(shape.step)} if shape.step is not None else {}
    plot = LinePlot("curves", f"Triage: {len(train)} steps of {loop} ({shape.title})", {"train": train}, logy=logy, marks=marks)
    if val:
        # put the validation points on the step axis by repeating each value until the next one
        stretched, j = [], 0
        for i in range(len(train)):
            while j + 1 < len(val_steps) and val_steps[j + 1] <= i:
                j += 1
            stretched.append(val[j])
        plot.series["validation"] = stretched
    return plot
