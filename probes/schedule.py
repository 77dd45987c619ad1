"""Learning-rate scheduler cadence: does the user's train_epoch step the scheduler as often as the
scheduler was designed to be stepped?

The user's ``train_epoch`` runs for a few short epochs over fixed batches while an optimizer step
pre-hook records the learning rate at every ``optimizer.step()`` and a wrapper on the scheduler
instance counts ``scheduler.step()`` calls per epoch. The intended cadence comes from the scheduler
itself: OneCycleLR and CyclicLR are per-iteration by design (their documentation says to step them
after every batch); StepLR, MultiStepLR and CosineAnnealingLR whose whole horizon is shorter than
one epoch of the user's loader are per-epoch (stepped per batch they would be over within the first
epoch). Other schedulers (LambdaLR warm-ups, ExponentialLR...) have no readable intent and are only
reported. The intended curve is replayed on a second optimizer built by the user's own factories.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch.optim import lr_scheduler as S

from nnwizard.record.frames import first_line
from nnwizard.probes.api import LinePlot, ProbeContext, failed, passed, probe, skipped
from nnwizard.probes.loop import FixedLoader

EPOCHS = 3
BATCHES = 6
PER_BATCH = tuple(c for c in (getattr(S, "OneCycleLR", None), getattr(S, "CyclicLR", None)) if c)


def _horizon(scheduler) -> int | None:
    """How many scheduler steps the schedule spans, where the scheduler says."""
    if isinstance(scheduler, S.StepLR):
        return int(scheduler.step_size)
    if isinstance(scheduler, S.MultiStepLR):
        return max(scheduler.milestones) if scheduler.milestones else None
    if isinstance(scheduler, S.CosineAnnealingLR):
        return int(scheduler.T_max)
    return None


def intended_cadence(scheduler, loader_len: int) -> tuple[str | None, str]:
    """('batch' | 'epoch' | None, why)."""
    name = type(scheduler).__name__
    if PER_BATCH and isinstance(scheduler, PER_BATCH):
        total = getattr(scheduler, "total_steps", None)
        return "batch", f"{name} is a per-iteration schedule" + (f" over {total} steps" if total else "")
    horizon = _horizon(scheduler)
    if horizon is not None and loader_len and horizon < loader_len:
        return "epoch", (f"{name} spans {horizon} steps, fewer than the {loader_len} batches of one epoch: "
                         f"it counts epochs")
    return None, f"{name} does not say whether it counts batches or epochs"


def _lr(optimizer) -> float:
    return float(optimizer.param_groups[0]["lr"])


def _replay(target, seed: int, cadence: str, steps: int, per_epoch: int) -> list[float]:
    """The LR at each optimizer step when the user's scheduler is stepped at ``cadence``."""
    model = target.fresh_model(seed)
    optimizer = target.make_optimizer(model)
    scheduler = target.make_scheduler(optimizer)
    lrs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in range(steps):
            lrs.append(_lr(optimizer))
            if cadence == "batch" or (i + 1) % per_epoch == 0:
                scheduler.step()
    return lrs


@probe(
    "scheduler-cadence",
    title="Learning rate at every optimizer.step() of the user's train_epoch",
    outcomes={"ok": "the scheduler is stepped at the cadence it was designed for (or its intent is unknown)",
              "per-epoch-for-per-step": "a per-iteration schedule is stepped once per epoch",
              "per-step-for-per-epoch": "an epoch-based schedule is stepped every batch",
              "never-stepped": "train_epoch never calls scheduler.step()",
              "crashed": "train_epoch raised"},
    timeout_s=60,
    cost=10,
)
def scheduler_cadence(ctx: ProbeContext):
    target = ctx.target
    if not target.user_train_epoch:
        return skipped("no user train_epoch: the scheduler is stepped by the wizard's own loop")
    model = target.fresh_model(ctx.seed)
    optimizer = target.make_optimizer(model)
    scheduler = target.make_scheduler(optimizer)
    if scheduler is None:
        return skipped("the module builds no scheduler (build_scheduler)")
    if isinstance(scheduler, S.ReduceLROnPlateau):
        return skipped("ReduceLROnPlateau steps on a metric, not on a clock")
    name = type(scheduler).__name__
    batches = target.batches(BATCHES)
    loader = FixedLoader(batches, target.train_loader)
    lrs: list[float] = []
    counts = {"opt": 0, "sched": 0}
    per_epoch_sched: list[int] = []
    per_epoch_opt: list[int] = []

    def pre_hook(opt, args, kwargs):
        lrs.append(_lr(opt))
        counts["opt"] += 1

    original = scheduler.step

    def counted_step(*args, **kwargs):
        counts["sched"] += 1
        return original(*args, **kwargs)

    handle = optimizer.register_step_pre_hook(pre_hook)
    scheduler.step = counted_step  # this instance only, for the duration of the probe
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for epoch in range(EPOCHS):
                if ctx.time_left() < 2:
                    break
                before = dict(counts)
                target.user_train_epoch(model, loader, target.loss_fn, optimizer, scheduler)
                per_epoch_sched.append(counts["sched"] - before["sched"])
                per_epoch_opt.append(counts["opt"] - before["opt"])
    except Exception as exc:
        return failed("crashed", f"train_epoch raised with {name}: {first_line(exc)}", error=first_line(exc),
                      scheduler=name, training_raised=True)
    finally:
        handle.remove()
        del scheduler.step
    loader_len = len(target.train_loader)
    intent, why = intended_cadence(scheduler, loader_len)
    epochs = len(per_epoch_sched)
    sched_steps = sum(per_epoch_sched)
    opt_steps = sum(per_epoch_opt)
    per_epoch = max(1, round(opt_steps / max(epochs, 1)))
    if sched_steps == 0:
        observed = "none"
    elif all(c == 1 for c in per_epoch_sched):
        observed = "epoch"
    elif all(s >= o > 0 for s, o in zip(per_epoch_sched, per_epoch_opt)):
        observed = "batch"
    else:
        observed = "other"
    data: dict[str, Any] = dict(scheduler=name, intended=intent or "unknown", observed=observed, why=why,
                                schedule_steps=getattr(scheduler, "total_steps", None) or _horizon(scheduler),
                                epochs=epochs, optimizer_steps=opt_steps, scheduler_steps=sched_steps,
                                steps_per_epoch=per_epoch, loader_batches=loader_len,
                                lr_first=lrs[0] if lrs else float("nan"), lr_last=lrs[-1] if lrs else float("nan"))
    series = {f"traced ({observed})": lrs}
    marks = {f"epoch {e + 2} starts": float(sum(per_epoch_opt[: e + 1])) for e in range(epochs - 1)}
    if intent is not None and lrs:
        try:
            wanted = _replay(target, ctx.seed, intent, len(lrs), per_epoch)
            series[f"intended (per {intent})"] = wanted
            data["lr_last_intended"] = wanted[-1]
        except Exception as exc:  # replay failing must not hide the trace
            data["replay_error"] = first_line(exc)
    plot = LinePlot("lr", f"{name}: learning rate at each optimizer.step() of train_epoch", series,
                    xlabel="optimizer step", ylabel="learning rate", marks=marks)
    head = (f"train_epoch stepped {name} {sched_steps} times over {epochs} epochs of {per_epoch} optimizer steps; "
            f"LR {data['lr_first']:.3g} -> {data['lr_last']:.3g}")
    if observed == "none":
        return failed("never-stepped", f"{head}: scheduler.step() is never called", [plot], **data)
    if intent == "batch" and observed == "epoch":
        target_lr = f" (stepped per batch it would be at {data['lr_last_intended']:.3g})" if "lr_last_intended" in data else ""
        return failed("per-epoch-for-per-step", f"{head}{target_lr}; {why}", [plot], **data)
    if intent == "epoch" and observed == "batch":
        target_lr = f" (stepped per epoch it would be at {data['lr_last_intended']:.3g})" if "lr_last_intended" in data else ""
        return failed("per-step-for-per-epoch", f"{head}{target_lr}; {why}", [plot], **data)
    return passed(f"{head}; {why}", artifacts=[plot], **data)
