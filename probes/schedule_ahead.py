"""``schedule-ahead``: the learning-rate schedule read ahead, over the run the script plans.

A short diagnosis sees the first steps of a schedule: a warm-up that will carry the rate to 100x its base
looks harmless at step 60. This probe steps a copy of each scheduler the program builds (script mode: the
scheduler objects the recording saw stepped; module mode: ``build_scheduler`` on a fresh optimizer), on a
throwaway optimizer with the same parameter groups (their rates and every other key a scheduler reads,
such as OneCycleLR's ``max_lr``), from its first step over its own horizon (OneCycleLR's ``total_steps``,
CosineAnnealingLR's ``T_max``...) or, where it has none, ``AHEAD`` scheduler steps. It reports the curve:
its peak against the rate the optimizer was given, where the peak falls in optimizer steps (the cadence
measured in the run: scheduler steps per optimizer step), where the rate falls below 1% of its start, and
the peak against the rates the lr sweep measured (``lr-sweep`` / ``script-lr-sweep``, when it ran):

- ``overshoot``: a multiplier schedule (LambdaLR, MultiplicativeLR, LinearLR...) whose factor climbs to
  ``OVERSHOOT`` or more: the warm-up ramps far above the rate the optimizer was configured with;
- ``above-trainable``: the peak lies above a rate the sweep measured as too high (its x10 arm diverged or
  did worse than the configured rate);
- ``ends-early``: the rate falls below 1% of its start within the first epoch (or ``EARLY`` optimizer steps)
  while the run goes on: the schedule is over before the training is;
- ``ok`` otherwise (the curve is still reported).

It trains nothing and calls no user code (module mode: the user's ``build_scheduler`` once).
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import torch
from torch.optim import lr_scheduler as S

from nnwizard.record.frames import first_line
from nnwizard.probes.api import LinePlot, ProbeContext, failed, passed, probe, skipped

AHEAD = 5000        # scheduler steps read ahead when the scheduler has no horizon of its own
MAX_AHEAD = 20000   # at most
OVERSHOOT = 10.0    # a multiplier schedule whose factor climbs this far above 1 overshoots
EARLY = 200         # optimizer steps: a schedule that decays to 1% within them (or within one epoch) ends early
FLOOR = 0.01        # "the rate has ended": below this share of its start
# schedules whose peak is set on purpose above the optimizer's rate (their own max_lr): no overshoot rule
BY_DESIGN = tuple(c for c in (getattr(S, "OneCycleLR", None), getattr(S, "CyclicLR", None)) if c)


def horizon(scheduler) -> int | None:
    """Scheduler steps the schedule spans, where it says."""
    for attr in ("total_steps", "T_max", "total_iters"):
        value = getattr(scheduler, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    if isinstance(scheduler, S.CosineAnnealingWarmRestarts):
        return int(scheduler.T_0) * 4
    if isinstance(scheduler, S.StepLR):
        return int(scheduler.step_size) * 5
    if isinstance(scheduler, S.MultiStepLR) and scheduler.milestones:
        return max(scheduler.milestones) + 1
    if isinstance(scheduler, S.SequentialLR):
        tail = horizon(scheduler._schedulers[-1])
        return (scheduler._milestones[-1] + tail) if tail and scheduler._milestones else None
    return None


def _throwaway(optimizer) -> torch.optim.Optimizer:
    """An SGD over one dummy tensor per group of ``optimizer``, each group with the same keys (rates,
    momentum, OneCycleLR's max_lr...), its rate back at the start of the schedule."""
    groups = []
    for g in optimizer.param_groups:
        group = {k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
        if "initial_lr" in group:
            group["lr"] = group["initial_lr"]
        groups.append({**group, "params": [torch.zeros(1, requires_grad=True)]})
    new = torch.optim.SGD(groups, lr=groups[0].get("lr", 1e-3) if groups else 1e-3)
    new.defaults.update({k: v for k, v in optimizer.defaults.items() if k not in new.defaults})
    return new


def _rebind(scheduler, optimizer):
    """A copy of ``scheduler`` driving ``optimizer``, back at its first step (schedulers it wraps too)."""
    new = copy.copy(scheduler)
    state = {}
    for k, v in scheduler.__dict__.items():
        if k == "optimizer":
            state[k] = optimizer
        elif k == "_schedulers":
            state[k] = [_rebind(s, optimizer) for s in v]
        else:
            try:
                state[k] = copy.deepcopy(v)
            except Exception:  # noqa: BLE001 - a lambda's closure that does not copy: share it (it is only read)
                state[k] = v
    new.__dict__ = state
    if hasattr(new, "base_lrs"):
        for g, base in zip(optimizer.param_groups, new.base_lrs):
            g["lr"] = base
    new.last_epoch = -1
    if hasattr(new, "_step_count"):
        new._step_count = 0
    # the constructor's first step, as a new scheduler takes it (torch >= 2.x marks it "initial": it must not
    # move the rate; older versions read last_epoch == 0)
    if isinstance(new, S.SequentialLR):
        for child in new._schedulers:
            child.last_epoch = -1
        for g in optimizer.param_groups:
            g["lr"] = g.get("initial_lr", g["lr"])
        _first_step(new._schedulers[0])
        new.last_epoch = 0
    else:
        _first_step(new)
    return new


def schedule_lines(paths) -> list[str]:
    """``file:line `code``` of each place in these source files that sets the learning rate's schedule: a scheduler
    built (``LambdaLR(...)``, ``get_linear_schedule_with_warmup(...)``) or a rate assigned by hand
    (``group["lr"] = ...``). A static read, for a report that must name the schedule's line without the run's
    objects (a replayed bundle)."""
    import ast
    from pathlib import Path

    from nnwizard.probes._crash import _code_only

    names = {n for n in dir(S) if isinstance(getattr(S, n), type) and n.endswith(("LR", "Restarts"))}
    found = []
    for path in dict.fromkeys(Path(p) for p in paths if p):
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
            tree = ast.parse(text)
        except (OSError, SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            hit = False
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                hit = name in names or (name.startswith("get_") and name.endswith("schedule_with_warmup"))
            elif isinstance(node, ast.Assign):
                hit = any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and t.slice.value == "lr"
                          for t in node.targets)
            if hit and 0 < node.lineno <= len(lines):
                found.append((node.lineno, f"{path.name}:{node.lineno} `{_code_only(lines[node.lineno - 1].strip())[:120]}`"))
    return [text for _, text in sorted(set(found))]


def _first_step(scheduler) -> None:
    if hasattr(scheduler, "_initial_step"):
        scheduler._initial_step()
    else:
        scheduler.step()


def read_ahead(scheduler, optimizer, steps: int | None = None) -> dict[str, Any]:
    """The curve of group 0's rate over the schedule (stepping a copy; the original is untouched)."""
    opt = _throwaway(optimizer)
    start = float(opt.param_groups[0].get("initial_lr", opt.param_groups[0]["lr"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        copy_ = _rebind(scheduler, opt)
        n = min(steps or horizon(scheduler) or AHEAD, MAX_AHEAD)
        lrs = [float(opt.param_groups[0]["lr"])]
        for _ in range(n - 1):
            try:
                copy_.step()
            except (ValueError, ZeroDivisionError) as exc:   # OneCycleLR past total_steps raises
                return dict(lrs=lrs, base=start, raised=first_line(exc), steps=len(lrs))
            lrs.append(float(opt.param_groups[0]["lr"]))
    return dict(lrs=lrs, base=start, steps=len(lrs))


def _sweep_ceiling(results: dict) -> tuple[float | None, str]:
    """The lowest rate the lr sweep measured as too high (its x10 arm diverged or did clearly worse), over the rates
    that arm really ran at (a warm-up scales them: its last rate); None when no sweep says so."""
    for pid in ("script-lr-sweep", "lr-sweep"):
        r = results.get(pid)
        if r is None or r.status not in ("passed", "failed") or "lr" not in r.data:
            continue
        lr = r.data.get("lr")
        top = r.data.get("warmup_to") or lr
        if not isinstance(top, (int, float)) or not top:
            continue
        x10, x1 = r.data.get("drop_lrx10"), r.data.get("drop_lr")
        if x10 is None:
            continue
        if not math.isfinite(x10):
            return 10 * top, f"{pid}: its x10 arm (up to lr {10 * top:.3g}) diverged"
        if isinstance(x1, (int, float)) and math.isfinite(x1) and x10 < x1 - 0.1:
            return 10 * top, f"{pid}: its x10 arm (up to lr {10 * top:.3g}) removed {x10:.0%} of the loss against {x1:.0%} at the configured rate"
    return None, ""


def _cadence(rec, entry) -> tuple[float, str]:
    """Optimizer steps per scheduler step in the recorded run, and in words."""
    opt = entry.get("optimizer")
    steps = [s for s in rec.steps if opt is None or s.optimizer == opt] or rec.steps
    n = entry.get("steps", 0)
    if not n or not steps:
        return 1.0, "not stepped in the observed run: read per scheduler step"
    per = len(steps) / n
    if per <= 1.25:
        return 1.0, f"stepped after every optimizer step ({n} scheduler steps over {len(steps)} optimizer steps)"
    return per, f"stepped about every {per:.3g} optimizer steps (once per epoch?: {n} over {len(steps)})"


def _judge(name: str, scheduler, curve: dict, per: float, cadence: str, epoch_steps: int | None,
           results: dict, more_planned: bool) -> tuple[str, str, dict]:
    lrs, base = curve["lrs"], curve["base"]
    peak = max(lrs)
    at = lrs.index(peak)
    factor = peak / base if base > 0 else math.inf
    low = next((i for i, v in enumerate(lrs) if v < FLOOR * lrs[0]), None) if lrs[0] > 0 else None
    data: dict[str, Any] = dict(scheduler=name, base_lr=base, peak_lr=peak, peak_factor=factor, peak_step=at,
                                peak_optimizer_step=round(at * per), read_steps=len(lrs), cadence=cadence,
                                steps_per_scheduler_step=per, end_lr=lrs[-1])
    if curve.get("raised"):
        data["raised"] = curve["raised"]
    text = (f"{name} read ahead over {len(lrs)} scheduler steps ({cadence}): lr {lrs[0]:.3g} at the start, peak "
            f"{peak:.3g} ({factor:.3g}x the optimizer's lr {base:.3g}) at scheduler step {at}"
            + (f" (optimizer step ~{round(at * per)})" if per != 1.0 else "") + f", {lrs[-1]:.3g} at the end")
    ceiling, sweep = _sweep_ceiling(results)
    if ceiling is not None:
        data.update(sweep_ceiling=ceiling)
    if ceiling is not None and peak >= ceiling:
        return "above-trainable", f"{text}; the peak is at or above {ceiling:.3g}, where the {sweep}", data
    if not isinstance(scheduler, BY_DESIGN) and factor >= OVERSHOOT:
        first_over = next((i for i, v in enumerate(lrs) if v > 1.0 * base * 1.0001), None)
        data.update(passes_base_step=first_over)
        return "overshoot", (f"{text}: the schedule multiplies the rate up to {factor:.3g}x, climbing past the "
                             f"configured lr at scheduler step {first_over}; a warm-up normally ends at 1x"), data
    if low is not None and more_planned:
        opt_steps = round(low * per)
        limit = min(EARLY, epoch_steps) if epoch_steps else EARLY
        data.update(ends_step=low, ends_optimizer_step=opt_steps)
        if opt_steps < limit:
            where = f"within the first epoch ({epoch_steps} optimizer steps)" if epoch_steps and opt_steps < epoch_steps else \
                f"within {opt_steps} optimizer steps"
            return "ends-early", f"{text}; the rate falls below 1% of its start at optimizer step ~{opt_steps}, {where}, while the run goes on", data
    return "ok", text, data


@probe(
    "schedule-ahead",
    title="The learning-rate schedule stepped ahead over the planned run, on a copy",
    outcomes={"ok": "the schedule stays within its rate and ends where the run does",
              "overshoot": "a warm-up or multiplier schedule ramps far above the configured rate",
              "above-trainable": "the schedule's peak lies above a rate the lr sweep measured as too high",
              "ends-early": "the rate falls to ~0 long before the run ends",
              "no-scheduler": "no scheduler object to step (none, or one that steps on a metric)"},
    timeout_s=30,
)
def schedule_ahead(ctx: ProbeContext):
    target = ctx.target
    rec = getattr(target, "recording", None)
    results = ctx.results
    found = []
    if rec is not None:
        train_loaders = [l for l in rec.loaders if any(b > 0 for b in l.backwards)]
        epoch_steps = train_loaders[0].length if train_loaders else None
        more = bool(rec.stopped) or any(info.iterations > 1 for info in train_loaders)
        for entry in rec.schedulers:
            obj = entry["object"]
            if isinstance(obj, S.ReduceLROnPlateau) or getattr(obj, "optimizer", None) is None:
                continue
            per, cadence = _cadence(rec, entry)
            found.append((entry["name"], obj, obj.optimizer, per, cadence, epoch_steps, more))
    else:
        try:
            model = target.fresh_model(ctx.seed)
            optimizer = target.make_optimizer(model)
            scheduler = target.make_scheduler(optimizer)
        except Exception as exc:  # noqa: BLE001 - the user's factories raising is other probes' evidence
            return skipped(f"build_scheduler could not be called: {first_line(exc)}")
        if scheduler is not None and not isinstance(scheduler, S.ReduceLROnPlateau):
            loader = target.loader("train")
            cadence = ctx.results.get("scheduler-cadence")
            per_epoch = cadence is not None and cadence.data.get("observed") == "epoch"
            steps = len(loader) if loader is not None else None
            found.append((type(scheduler).__name__, scheduler, optimizer, float(steps or 1) if per_epoch else 1.0,
                          "stepped per epoch by train_epoch" if per_epoch else "stepped per optimizer step", steps, True))
    if not found:
        return passed("the program builds no scheduler that steps on a clock: nothing to read ahead", "no-scheduler")
    worst = None
    plots = {}
    for name, obj, optimizer, per, cadence, epoch_steps, more in found:
        try:
            curve = read_ahead(obj, optimizer)
        except Exception as exc:  # noqa: BLE001 - a scheduler of its own kind that does not copy
            worst = worst or ("ok", f"{name} could not be stepped ahead on a copy: {first_line(exc)}", dict(scheduler=name))
            continue
        outcome, text, data = _judge(name, obj, curve, per, cadence, epoch_steps, results, more)
        plots[name] = curve["lrs"][:: max(1, len(curve["lrs"]) // 400)]
        if worst is None or (worst[0] == "ok" and outcome != "ok"):
            worst = (outcome, text, data)
    outcome, text, data = worst
    plot = [LinePlot("schedule-ahead", "Learning rate read ahead (every k-th scheduler step)", plots,
                     xlabel="scheduler step (sampled)", ylabel="learning rate")] if plots else []
    if outcome == "ok":
        return passed(text, artifacts=plot, **data)
    return failed(outcome, text, plot, **data)
