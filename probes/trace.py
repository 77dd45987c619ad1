"""Audits of a recorded run of the user's script (script mode, CONTRACT §6).

Each probe reads the :class:`~nnwizard.recorder.Recording` of the real program, wherever the user
wrote the loop (inline in ``main()``, a ``train()``/``test()`` pair, a trainer class, a notebook
export), and measures one thing the module-mode loop audits measure on a ``train_step``: gradients
cleared between steps, backward and step called, the optimizer over the trained parameters,
evaluation in eval mode and without a graph, train mode restored, scheduler cadence, loss scale
under accumulation, graphs kept across steps, the loss against the right tensor, the first
non-finite step, the exception the script raised, and the curves of the run itself. On a module
target (no recording) every one of them is skipped.
"""

from __future__ import annotations

import functools
import math
import statistics
from pathlib import Path
from typing import Any, Callable

from nnwizard.curves import UNBOUNDED_MIN, Curves, classify, falls_unbounded
from nnwizard.probes._instrument import error_kind
from nnwizard.probes.loop import Coverage
from nnwizard.probes.outputs import clamped
from nnwizard.probes.triage import CURVE_OUTCOMES
from nnwizard.probes._objectives import ADVERSARIAL, adversarial_reason, idle_models_text, objectives, optimizer_label
from nnwizard.probes.api import LinePlot, ProbeContext, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.recorder import inner_model


def _on_recording(audit: Callable[[ProbeContext, Any], Any]) -> Callable[[ProbeContext], Any]:
    """An audit of the recording: called as ``audit(ctx, recording)``; skipped on a module target."""
    @functools.wraps(audit)
    def run(ctx: ProbeContext):
        rec = getattr(ctx.target, "recording", None)
        if rec is None:
            return skipped("script mode only: this audit reads the recording of a script run")
        return audit(ctx, rec)
    return run


def _fmt(v, spec=".4g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return format(v, spec)


def _train_calls(rec):
    return [c for c in rec.loss_calls if not c.eval]


def _terms(call) -> int:
    """How many terms a ``reduction='sum'`` loss call added up: what ``reduction='mean'`` divides by."""
    if call.target_shape is not None and "int" in (call.target_dtype or ""):
        return max(math.prod(call.target_shape), 1)    # class ids: one term per id
    shape = call.input_shape or []
    if call.fn in ("cross_entropy", "nll_loss") and len(shape) >= 2:
        return max(math.prod(shape) // max(shape[1], 1), 1)   # class probabilities along dim 1
    return max(math.prod(shape), 1)


def eval_curve(rec) -> tuple[list[float], list[int]]:
    """Mean loss of each evaluation phase (loss calls no backward reached), at the step it ran. An
    evaluation that sums its loss (``reduction='sum'``, pytorch/examples' ``test()``) while training
    averages it is brought to the training loss's scale, one term's mean: a per-batch sum is
    batch-size times a mean, and the curve shapes compare the two curves' levels."""
    summed_training = any(c.reduction == "sum" for c in _train_calls(rec))
    by_step: dict[int, list[float]] = {}
    for c in rec.loss_calls:
        if c.eval and c.value is not None and math.isfinite(c.value):
            scale = _terms(c) if c.reduction == "sum" and not summed_training else 1
            by_step.setdefault(c.step, []).append(c.value / scale)
    steps = sorted(by_step)
    return [sum(by_step[s]) / len(by_step[s]) for s in steps], steps


# ------------------------------------------------------------------------------------ the run
def _step_losses(rec) -> list[float]:
    """One loss a recorded step (NaN where a step with a backward has none). A step with no loss and no backward of
    its own (a second optimizer stepped after the same backward: a decoder's beside its encoder's) repeats the loss
    of the step before it: it is not a non-finite loss, and the curve keeps one point per optimizer step."""
    out: list[float] = []
    for s in rec.steps:
        value = s.loss if s.loss is not None else s.loss_call_mean
        if value is None and not s.backwards:
            value = out[-1] if out else next((t.loss for t in rec.steps if t.loss is not None), math.nan)
        out.append(math.nan if value is None else value)
    return out


@probe(
    "trace-run",
    title="The script's own run: what it built, and the shape of its loss curves",
    outcomes={**CURVE_OUTCOMES, "crashed": "the script raised",
              "too-short": "too few optimizer steps were recorded to read a curve", **ADVERSARIAL},
    timeout_s=30,
)
@_on_recording
def trace_run(ctx: ProbeContext, rec):
    target = ctx.target
    train = _step_losses(rec)
    val, val_steps = eval_curve(rec)
    reference = None
    how = None
    if getattr(target, "capturable", False):
        try:
            expected = target.expected_initial_loss(target.batch()[1])
        except Exception:  # noqa: BLE001 - no reference then
            expected = None
        if expected:
            reference, how = expected
    info: dict[str, Any] = dict(steps=len(train), train=[round(v, 6) for v in train], val=[round(v, 6) for v in val],
                                val_steps=val_steps, seconds=rec.seconds, stopped=rec.stopped or "",
                                models=len(rec.models), optimizers=len(rec.optimizers), reference=reference,
                                reference_how=how, measured_step_s=getattr(target, "measured_step_s", None))
    if rec.error is not None:
        err = rec.error
        info.update(error=f"{err.type}: {err.message}", where=err.where or "?", step=err.step, symptoms=["crash"],
                    shape="crashed")
        plots = [LinePlot("curves", f"The script's loss before it raised ({len(train)} steps)", {"train": train})] if train else []
        return failed("crashed", f"the script raised after {err.step} optimizer steps at {err.where or '?'}: "
                      f"{err.type}: {err.message}", plots, **info)
    if len(train) < 4:
        if rec.stopped:  # the budget cut the run before its curve could be read: a measurement missing
            return cannot_run(f"only {len(train)} optimizer steps fit the budget ({rec.stopped}): too few to read a "
                              f"curve (its steps are slow for the script-mode time limit: a smaller batch or model size would fit)", "too-short",
                              reason="budget", **info)
        return skipped(f"only {len(train)} optimizer steps were recorded: too few to read a curve", "too-short", **info)
    objs = objectives(rec)
    if objs.several:   # each optimizer's own series is a curve; the interleaved one is not
        info.update(objectives=objs.text, objective_series={optimizer_label(rec, i): [round(v, 6) for v in v_]
                                                            for i, v_ in objs.series.items()})
        plots = [LinePlot("curves", f"The script's own run, per optimizer (x: its own steps; {len(rec.steps)} optimizer steps in all)",
                          {optimizer_label(rec, i): v_ for i, v_ in objs.series.items()})]
        if objs.adversarial:
            result = skipped(adversarial_reason(objs), "adversarial", **info)
            result.artifacts = plots   # what was observed, shown, not judged
            return result
        if min(len(v_) for v_ in objs.series.values()) < 4:
            short = f"{objs.text}: fewer than 4 steps of one optimizer were recorded: too few to read its curve"
            if rec.stopped:   # the budget cut the run: a measurement missing
                return cannot_run(f"{short} ({rec.stopped})", "too-short", reason="budget", **info)
            return skipped(short, "too-short", **info)
        shapes = {i: classify(Curves(train=v_)) for i, v_ in objs.series.items()}
        judged = next((i for i, sh in shapes.items() if not sh.normal), next(iter(shapes)))
        shape, train, val, reference = shapes[judged], objs.series[judged], [], None
        info.update(train=[round(v, 6) for v in train], val=[], judged=optimizer_label(rec, judged))
        others = "; ".join(f"{optimizer_label(rec, i)}: {sh.title}" for i, sh in shapes.items() if i != judged)
    shape = shape if objs.several else classify(Curves(train=train, val=val or None, val_steps=val_steps or None), reference)
    symptoms = list(shape.symptoms)
    info.update(shape=shape.shape, shape_title=shape.title, shape_evidence=shape.evidence,
                intervention=shape.intervention, lr_advice=shape.lr, symptoms=symptoms,
                **{k: v for k, v in shape.data.items() if k not in info})
    if shape.step is not None:
        info["event_step"] = shape.step
    logy = all(v > 0 for v in train + val if math.isfinite(v))
    plot = LinePlot("curves", f"The script's own run: {len(train)} optimizer steps ({shape.title})", {"train": train},
                    x=list(range(1, len(train) + 1)), logy=logy)
    if val:   # each evaluation phase at the optimizer step it followed
        plot.series["evaluation"] = val
        plot.xs["evaluation"] = val_steps
    ref = f" (reference {reference:.4g}: {how})" if reference else ""
    text = f"{len(train)} optimizer steps of the script in {rec.seconds:.1f} s: {shape.title}: {shape.evidence}{ref}"
    if objs.several:
        plot = plots[0]
        text = (f"{len(rec.steps)} optimizer steps of the script in {rec.seconds:.1f} s; {objs.text}; judged per optimizer: "
                f"{optimizer_label(rec, judged)} ({len(train)} steps): {shape.title}: {shape.evidence}" + (f"; {others}" if others else ""))
    if shape.normal:
        return passed(text, "ok", [plot], **info)
    return failed(shape.shape, text, [plot], **info)


# ------------------------------------------------------------------------------------ gradients
@probe(
    "trace-zero-grad",
    title="Are gradients cleared between the script's optimizer steps?",
    outcomes={"ok": "gradients are cleared (zero_grad, set to None or zeroed) before each step's backward",
              "carry-over": "the gradients of the previous step are still there when the next backward runs",
              "too-short": "fewer than two optimizer steps were recorded"},
    timeout_s=10,
)
@_on_recording
def trace_zero_grad(ctx: ProbeContext, rec):
    later = rec.steps[1:]
    measured = [s.carried for s in later if s.carried is not None]
    if not later or not measured:
        return skipped(f"{len(rec.steps)} optimizer steps recorded: need two with a backward between", "too-short")
    carried = sum(measured) / len(measured)
    calls = sum(1 for s in later if s.zero_grad)
    measured_norms = [s.grad_norm for s in rec.steps if s.grad_norm is not None]   # (sampled after the first steps)
    growth = (measured_norms[-1] if measured_norms else 0.0) / max(rec.steps[0].grad_norm or 0.0, 1e-30)
    data = dict(steps=len(rec.steps), carried=carried, zero_grad_steps=calls, zero_grad_calls=rec.zero_grads,
                grad_growth=growth, checked=len(measured))
    # with several optimizers each must clear its own gradients: judged per optimizer, the worst one
    by_opt: dict[int, list[float]] = {}
    for s in later:
        if s.carried is not None:
            by_opt.setdefault(s.optimizer, []).append(s.carried)
    worst = max(by_opt, key=lambda i: sum(by_opt[i]) / len(by_opt[i]))
    share = sum(by_opt[worst]) / len(by_opt[worst])
    if len(by_opt) > 1:
        data.update(carried_by={str(i): sum(v) / len(v) for i, v in by_opt.items()}, carried_worst=share)
    if share > 0.5:
        whose = "the optimizer's"
        if len(by_opt) > 1 and 0 <= worst < len(rec.optimizers):
            models = [rec.models[m].name for m in rec.optimizers[worst].models if m < len(rec.models)]
            whose = f"optimizer #{worst + 1}'s ({rec.optimizers[worst].name}{' over ' + ', '.join(models) if models else ''})"
            norms = [s.grad_norm for s in rec.steps if s.optimizer == worst and s.grad_norm is not None] or [0.0]
            growth = norms[-1] / max(norms[0], 1e-30)
            data["grad_growth"] = growth
        n = len(by_opt[worst])
        return failed("carry-over", f"at the first backward after each of {n} optimizer steps, {share:.0%} of "
                      f"{whose} gradients still held the previous step's values (zero_grad called before "
                      f"{calls} of {len(later)} steps); "
                      + (f"the gradient norm grew {growth:.1f}x" if growth >= 1 else
                         f"the gradient norm ended at {growth:.2g}x its first measured value"), **data)
    return passed(f"gradients were cleared before the backward of {len(measured) - round(carried * len(measured))} of "
                  f"{len(measured)} steps (zero_grad before {calls} of {len(later)})", **data)


@probe(
    "trace-backward-step",
    title="Did the script call backward() and optimizer.step(), and did the parameters move?",
    outcomes={"ok": "backward and step ran, the parameters moved",
              "no-backward": "the loss was computed in grad mode but backward() never ran",
              "no-step": "backward() ran but optimizer.step() never did",
              "no-optimizer": "no optimizer ever stepped and the parameters never changed",
              "manual-update": "the parameters changed without an optimizer (a hand-written update)",
              "no-grad-at-step": "optimizer.step() ran but none of its parameters had a gradient",
              "no-update": "optimizer.step() ran with gradients but no parameter changed",
              "optimizer-never-steps": "one of several optimizers was built but never stepped",
              "no-training": "no model and no loss in grad mode: nothing to audit"},
    timeout_s=10,
)
@_on_recording
def trace_backward_step(ctx: ProbeContext, rec):
    train_calls = [c for c in rec.loss_calls if c.grad_enabled]
    trainable = sum(m.trainable for m in rec.models)
    data: dict[str, Any] = dict(backwards=rec.backwards, steps=len(rec.steps), loss_calls=len(train_calls),
                                optimizers=len(rec.optimizers), trainable=trainable)
    if not rec.models:
        return skipped("the script never called a model", "no-training", **data)
    moved = _moved(rec)
    data["moved"] = moved
    if rec.backwards == 0:
        if not train_calls and not rec.steps:
            return skipped("no loss was computed in grad mode and no optimizer stepped", "no-training", **data)
        if rec.error is not None and not rec.steps:   # it raised before a first backward could run: not a missing one
            return cannot_run(f"the script raised ({rec.error.type}) after {len(train_calls)} loss call(s) in grad mode "
                              f"and before any backward(): whether it calls backward() is not known", reason="raised", **data)
        return failed("no-backward", f"the script computed the loss {len(train_calls)} times in grad mode and called "
                      f"optimizer.step() {len(rec.steps)} times, but never called backward(): every .grad stayed empty",
                      **data)
    if not rec.steps:
        if moved:
            return passed(f"backward() ran {rec.backwards} times and the parameters changed without optimizer.step() "
                          f"(a hand-written update)", "manual-update", **data)
        if not rec.optimizers and not _built_optimizer(ctx):
            return failed("no-optimizer", f"backward() ran {rec.backwards} times but no optimizer ever stepped and no "
                          f"parameter changed", **data)
        return failed("no-step", f"backward() ran {rec.backwards} times but optimizer.step() was never called: every "
                      f"parameter is exactly as it was", **data)
    idle = idle_optimizers(rec)
    if idle:
        o = idle[0]
        data.update(idle=o.name, idle_index=o.index, idle_values=sum(g["values"] for g in o.groups),
                    idle_models=", ".join(rec.models[i].name for i in o.models) or "?")
        return failed("optimizer-never-steps", f"optimizer {o.index} ({o.name} over {data['idle_values']:,} values of "
                      f"{data['idle_models']}) was built{' and zeroed' if rec.zero_grads else ''} but never stepped, while "
                      f"{len(rec.steps)} steps of the other optimizer(s) ran: its parameters get gradients and never change",
                      **data)
    norms = [s.grad_norm or 0.0 for s in rec.steps]
    data.update(grad_norm=max(norms), first_grad_norm=norms[0])
    if gradless(rec):
        opt = rec.optimizers[rec.steps[0].optimizer] if rec.steps[0].optimizer >= 0 else None
        data["foreign"] = opt.foreign if opt else 0
        cleared, cut = _no_grad_cause(rec, opt, rec.steps)
        data.update(zero_after_backward=_cleared_every_time(cleared, rec.steps), zero_after_backward_steps=cleared, graph_cut=cut)
        why = (f"; zero_grad() ran after the backward and before optimizer.step() in {cleared} of them" if cleared else
               f"; the optimizer holds {', '.join(rec.models[i].name for i in opt.models)}'s own parameters, and no "
               f"backward reached any of its forwards: the graph between the model and the loss is cut" if cut else "")
        return failed("no-grad-at-step", f"optimizer.step() ran {len(rec.steps)} times but none of the optimizer's "
                      f"{rec.steps[0].grads_total} parameter tensors ever had a gradient, although backward() ran "
                      f"{rec.backwards} times{why}", **data)
    starved = _starved_optimizer(rec)
    if starved is not None:
        opt, own = starved, [s for s in rec.steps if s.optimizer == starved.index]
        others = ", ".join(sorted({rec.optimizers[s.optimizer].name for s in rec.steps
                                   if s.optimizer >= 0 and s.optimizer != opt.index}))
        cleared, cut = _no_grad_cause(rec, opt, own)
        names = ", ".join(rec.models[i].name for i in opt.models) or "?"
        data.update(foreign=opt.foreign, zero_after_backward=_cleared_every_time(cleared, own), zero_after_backward_steps=cleared,
                    graph_cut=cut, starved=opt.name, starved_index=opt.index, starved_models=names)
        why = (f"; zero_grad() ran after the backward and before its step() in {cleared} of them" if cleared else
               f"; it holds {names}'s own parameters, and no backward reached any of {names}'s forwards: the graph "
               f"between {names} and the loss is cut (a detach, .data, .item())" if cut else "")
        return failed("no-grad-at-step", f"optimizer {opt.index} ({opt.name} over {names}) stepped {len(own)} times but "
                      f"none of its {max(s.grads_total for s in own)} parameter tensors ever had a gradient, while the "
                      f"other optimizer(s) ({others}) stepped with gradients{why}", **data)
    updates = [s.update for s in rec.steps if s.update is not None]
    if updates and max(updates) == 0 and max(norms) > 0:
        data["lrs"] = rec.steps[0].lrs
        return failed("no-update", f"optimizer.step() ran {len(rec.steps)} times with gradient norm up to "
                      f"{max(norms):.3g} but no parameter changed (lr {rec.steps[0].lrs})", **data)
    manual = sum(s.manual for s in rec.steps)
    if manual:
        lrs = sorted(s.lrs[0] for s in rec.steps if s.manual and s.lrs)
        data.update(manual_steps=manual, effective_lr=lrs[len(lrs) // 2] if lrs else None)
        idle = unstepped_optimizers(rec)
        return passed(f"{rec.backwards} backward() calls and {manual} hand-written parameter updates (no torch.optim "
                      f"step{'' if manual == len(rec.steps) else ' for some parameters'}"
                      + (f"; {idle} is built but never stepped, zero_grad() ran {rec.zero_grads} times" if idle else "")
                      + f"); gradient norm {norms[0]:.3g} "
                      f"at the first; largest parameter change {max(updates, default=0.0):.3g}"
                      + (f"; |update| / |gradient| = {data['effective_lr']:.3g} (the learning rate of a plain SGD update)"
                         if lrs else ""), "manual-update", **data)
    return passed(f"{rec.backwards} backward() and {len(rec.steps)} optimizer.step() calls; gradient norm "
                  f"{norms[0]:.3g} at the first step; largest parameter change {max(updates, default=0.0):.3g}", **data)


def gradless(rec) -> bool:
    """Optimizer steps ran, and not one of them found a gradient on any of its parameters."""
    return bool(rec.steps) and all((s.grad_norm or 0.0) == 0 and s.grads_none == s.grads_total for s in rec.steps)


def _no_grad_cause(rec, opt, steps) -> tuple[int, bool]:
    """Why an optimizer's steps found no gradient: in how many zero_grad() ran between the backward and the step,
    and whether the graph was cut (it holds a model's own parameters and no backward ever reached that model's
    forwards: a detach, .data, torch.tensor(out), .item() between the model and the loss)."""
    cleared = sum(s.zero_grad_after_backward for s in steps)
    cut = bool(opt and opt.models and not opt.foreign and not cleared and set(opt.models) <= _cut_models(rec))
    return cleared, cut


def _cleared_every_time(cleared: int, steps) -> bool:
    """zero_grad() ran between the backward and the step at every step that had a backward before it (a loop
    that calls step() before backward() has none before its first step)."""
    return cleared > 0 and cleared == sum(s.backwards > 0 for s in steps)


def _starved_optimizer(rec):
    """With several optimizers stepping: the first whose every measured step found all of its
    parameters without a gradient, while another optimizer's steps had gradients (a GAN's generator
    whose output reaches the loss only through ``.detach()``); None otherwise."""
    by_opt: dict[int, list] = {}
    for s in rec.steps:
        if s.optimizer >= 0 and s.grads_total:
            by_opt.setdefault(s.optimizer, []).append(s)
    if len(by_opt) < 2:
        return None
    empty = [i for i, own in by_opt.items() if all((s.grad_norm or 0.0) == 0 and s.grads_none == s.grads_total for s in own)]
    if not empty or len(empty) == len(by_opt):
        return None
    return rec.optimizers[min(empty)]


def unstepped_optimizers(rec) -> str:
    """The optimizers the script built and never stepped, as text ("SGD"); "" if none."""
    return " and ".join(o.name for o in rec.optimizers if not o.steps)


def idle_optimizers(rec) -> list:
    """Optimizers built over trainable parameters that never stepped while others did; a wrapper
    (its parameters all held by an optimizer that steps: accelerate, Lightning) does not count, nor, in a run
    nnwizard cut short, one whose parameters no backward has reached yet: training in stages (layer by layer,
    a second phase) had not come to it."""
    stepped = [o for o in rec.optimizers if o.steps]
    if not stepped:
        return []
    held = {id(p) for o in stepped for g in o.optimizer.param_groups for p in g["params"]}
    idle = []
    for o in rec.optimizers:
        if o.steps:
            continue
        params = [p for g in o.optimizer.param_groups for p in g["params"] if p.requires_grad]
        if not params or all(id(p) in held for p in params):
            continue
        # (reached: a backward ran through one of its models' forwards in a recorded step; its .grad alone would not
        # say, a zero_grad() just before the cut sets it to None)
        reached = any(m in s.forwards for s in rec.steps for m in o.models)
        if rec.stopped and not reached and all(p.grad is None for p in params):
            continue
        idle.append(o)
    return idle


def _built_optimizer(ctx) -> bool:
    return bool(getattr(ctx.target, "recording", None) and ctx.target.recording.optimizers)


def _moved(rec) -> bool:
    """Did any model's parameters change from their initial copy?"""
    import torch

    for m in rec.models:
        if m.initial is None:
            continue
        for p, q in zip(m.module.parameters(), m.initial.parameters()):
            p = p.to_local() if hasattr(p, "to_local") else p   # (an FSDP2 DTensor in one process: its values)
            if p.shape == q.shape and not torch.equal(p.detach().cpu(), q.detach().cpu()):
                return True
    return False


@probe(
    "trace-optimizer",
    title="Does the script's optimizer hold the parameters of the model it trains?",
    outcomes={"ok": "every trainable parameter of the trained model is in an optimizer",
              "missing": "some trainable parameters of the trained model are in no optimizer",
              "foreign": "the optimizer holds none of the trained model's parameters (another instance)",
              "no-optimizer": "no optimizer was used"},
    timeout_s=10,
)
@_on_recording
def trace_optimizer(ctx: ProbeContext, rec):
    manual = [s for s in rec.steps if s.manual]
    if not rec.optimizers and not manual:
        return skipped("the script never stepped an optimizer", "no-optimizer")
    # the models the steps' backwards reached; before any step (a crash in the first), the models run with grad mode
    # on: a module only ever called under no_grad (an augmentation's blur kernel) is not one the script trains
    trained = {i for s in rec.steps for i in s.forwards} or {f.model for f in rec.forwards if f.grad_enabled} \
        or {m.index for m in rec.models}
    held = {id(p) for o in rec.optimizers for g in o.groups for p in g["params"]} | rec.manual_updated
    cover = Coverage.of(((f"{m.name}.{n}", p) for m in rec.models if m.index in trained
                         for n, p in inner_model(m.owner or m.module).named_parameters()), held)
    total, missing = cover.total, cover.n_missing
    groups = sum(len(o.groups) for o in rec.optimizers)
    who = ", ".join([o.name for o in rec.optimizers] + (["the hand-written update"] if manual else []))
    data = dict(optimizers=who, groups=groups, trainable=total, manual_steps=len(manual),
                missing_params=missing, missing_fraction=cover.fraction, missing_modules=cover.modules,
                foreign=sum(o.foreign for o in rec.optimizers))
    table = cover.table("Trainable parameters in no optimizer")
    if total and missing == total and data["foreign"]:
        return failed("foreign", f"the script's {data['optimizers']} holds {data['foreign']} tensors, none of them the "
                      f"{total:,} trainable values of the model it trains: it was built over another model instance",
                      table, **data)
    if missing:
        where = (f"in no param group of {who}" if not manual else f"never changed by {who} ({len(manual)} updates)"
                 if not rec.optimizers else f"in no param group of {', '.join(o.name for o in rec.optimizers)} and "
                 f"never changed by the hand-written update")
        return failed("missing", f"{missing:,} of {total:,} trainable values ({data['missing_fraction']:.0%}; "
                      f"{data['missing_modules']}) are {where}: they get gradients and never change", table, **data)
    if manual and not any(o.steps for o in rec.optimizers):
        idle = unstepped_optimizers(rec)
        return passed(f"the hand-written update changed all {total:,} trainable values of the trained model(s) "
                      f"({len(manual)} updates{'; ' + idle + ' is built but never stepped' if idle else ''})", **data)
    return passed(f"{data['optimizers']} ({groups} group(s)) holds all {total:,} trainable values of the trained model(s)", **data)


@probe(
    "trace-disconnected",
    title="Trainable parameters in the optimizer that never received a gradient in the script",
    outcomes={"ok": "every trainable parameter the optimizer holds got a gradient",
              "disconnected": "some trainable parameters had .grad None at every recorded step"},
    timeout_s=10,
)
@_on_recording
def trace_disconnected(ctx: ProbeContext, rec):
    # each optimizer's own first steps: with several (a GAN's two), one's tensors are not the other's
    by_opt: dict[int, list] = {}
    for s in rec.steps:
        if s.grads_total and len(by_opt.setdefault(s.optimizer, [])) < 3:
            by_opt[s.optimizer].append(s)
    if not by_opt:
        return skipped("no optimizer step with trainable parameters was recorded")
    if all(s.grads_none == s.grads_total for steps in by_opt.values() for s in steps):
        return skipped("no parameter got a gradient at all (see trace-backward-step)")
    names, total, counted = [], 0, 0
    for index, steps in by_opt.items():
        total += steps[0].grads_total
        counted = max(counted, len(steps))
        named = [s for s in steps if s.step <= 3]   # the recorder names the tensors on the run's first 3 steps
        always = set(named[0].none_names) if named else set()
        for s in named[1:]:
            always &= set(s.none_names)
        own = [n for n in named[0].none_names if n in always] if named else []
        if not own and all(s.grads_none == s.grads_total for s in steps):   # none_names may list only a few
            name = rec.optimizers[index].name if 0 <= index < len(rec.optimizers) else "an optimizer"
            own = [f"all {steps[0].grads_total} of {name} {index}'s tensors"]
        names += own
    data = dict(disconnected_tensors=len(names), modules=", ".join(sorted({n.rsplit(".", 1)[0] for n in names})[:6]),
                tensors=total)
    where = "in the optimizer" if len(by_opt) == 1 else f"in the {len(by_opt)} optimizers"
    if names:
        return failed("disconnected", f"{len(names)} of {total} trainable tensors {where} "
                      f"({', '.join(names[:5])}) had .grad None at each of the first {counted} optimizer steps: the "
                      f"loss does not depend on them", **data)
    return passed(f"all {total} trainable tensors {where} received a gradient", **data)


# ------------------------------------------------------------------------------------ evaluation
def _cut_models(rec) -> set[int]:
    """Models whose parameters a stepped optimizer holds while backward() ran and reached none of their
    forwards: the script cut the graph between model and loss (detach, .data), so its training forwards
    look like evaluation ones (unreached by a backward, scored by a loss) and cannot be told apart."""
    if not rec.backwards:
        return set()
    stepped = {m for o in rec.optimizers if o.steps for m in o.models}
    return stepped - {f.model for f in rec.forwards if f.trained}


def _phases(rec) -> list[list]:
    """Runs of consecutive model forwards that no backward reached and that look like evaluation:
    the script scored them (a loss, or a prediction: argmax, max, a threshold), ran them over a
    DataLoader iteration with no backward (a test loop, a validation loader), or put them in eval
    mode / no_grad itself. An unscored forward in the middle of training (a GAN generator sampling a
    picture from fixed noise, a logging forward) is not an evaluation phase."""
    def in_training(f) -> bool:
        if f.loader is None or f.loader >= len(rec.loaders):
            return True  # no DataLoader: only scoring or the mode tells
        backwards = rec.loaders[f.loader].backwards
        return 0 <= f.iteration < len(backwards) and backwards[f.iteration] > 0

    def evaluates(run) -> bool:
        return any(f.scored or not f.training or not f.grad_enabled or not in_training(f) for f in run)

    phases, current, cut = [], [], _cut_models(rec)
    for f in rec.forwards:
        if f.model in cut:
            continue  # its training forwards reach no backward (see trace-backward-step): not evaluation
        if f.trained:
            if current and evaluates(current):
                phases.append(current)
            current = []
        else:
            current.append(f)
    if current and evaluates(current):
        if not (rec.error is not None or rec.stopped):
            phases.append(current)  # a trailing run cut by the script's exception or the budget is not an evaluation
        elif all(not f.grad_enabled for f in current):
            phases.append(current)
    return phases


def _mode_models(rec) -> dict[int, Any]:
    """The models whose behaviour depends on train/eval mode: Dropout/BatchNorm modules, or a forward of the
    user's that branches on self.training (a functional dropout with training=self.training)."""
    return {m.index: m for m in rec.models if m.mode_layers or getattr(m, "reads_training", None)}


def _mode_parts(models) -> str:
    """What makes these models mode-dependent, in words."""
    layers = sum(m.mode_layers for m in models)
    reads = sorted({r for m in models for r in getattr(m, "reads_training", [])})
    parts = ([f"{layers} Dropout/BatchNorm layers"] if layers else []) + \
        ([f"the self.training branches of {', '.join(reads)}"] if reads else [])
    return " and ".join(parts)


@probe(
    "trace-eval-mode",
    title="Does the script evaluate with the model in eval mode?",
    outcomes={"ok": "every evaluation forward ran with model.training False",
              "train-mode-in-eval": "evaluation forwards ran with Dropout/BatchNorm in training mode",
              "no-mode-layers": "the model has no Dropout or BatchNorm module, so eval mode changes only code that reads self.training",
              "no-eval": "the script never evaluated (no forward without a backward)"},
    timeout_s=10,
)
@_on_recording
def trace_eval_mode(ctx: ProbeContext, rec):
    phases = _phases(rec)
    if not phases:
        return passed("the script never ran a forward without a backward: no evaluation to audit", "no-eval")
    evals = [f for p in phases for f in p]
    layered = _mode_models(rec)
    if not any(f.model in layered for f in evals):
        return passed("the evaluated model has no Dropout or BatchNorm module: eval mode changes only code that reads self.training (eval-stochastic checks a functional dropout)", "no-mode-layers",
                      phases=len(phases), forwards=len(evals))
    averaged = _averaged_models(rec)
    bad = [f for f in evals if f.model in layered and f.training and f.model not in averaged]
    if not bad and any(f.model in averaged and f.training for f in evals):
        names = ", ".join(sorted({rec.models[i].name for i in averaged}))
        return passed(f"the forwards in train mode outside training ran {names}, a copy whose parameters changed during the "
                      f"run without an optimizer (an averaged teacher, Mean Teacher style): its train mode is the "
                      f"script's choice, not an evaluation left in training mode", "ok", phases=len(phases),
                      forwards=len(evals), averaged=names)
    names = sorted({layered[f.model].name for f in bad})
    data = dict(phases=len(phases), forwards=len(evals), train_mode_forwards=len(bad), models=", ".join(names),
                layers=sum(layered[i].mode_layers for i in {f.model for f in bad}))
    if bad:
        return failed("train-mode-in-eval", f"{len(bad)} of {len(evals)} evaluation forwards ({len(phases)} phases) ran "
                      f"{', '.join(names)} with training=True: its {_mode_parts([layered[i] for i in {f.model for f in bad}])} "
                      f"behaved as in training (model.eval() missing)", **data)
    return passed(f"all {len(evals)} evaluation forwards ({len(phases)} phases) ran in eval mode", **data)


def _averaged_models(rec) -> set[int]:
    """Models no optimizer holds whose parameters still changed during the run (set by hand from another model's:
    an EMA teacher, Mean Teacher style), judged against the copy taken before their first forward."""
    import torch

    if not rec.steps:
        return set()
    held = {id(p) for o in rec.optimizers for g in o.optimizer.param_groups for p in g["params"]}
    out = set()
    for m in rec.models:
        if m.initial is None:
            continue
        now = list(inner_model(m.owner or m.module).parameters())
        if not now or any(id(p) in held for p in now):
            continue
        before = list(m.initial.parameters())
        if len(before) == len(now) and any(a.shape == b.shape and not torch.equal(a.detach().cpu(), b.detach().cpu())
                                           for a, b in zip(now, before)):
            out.add(m.index)
    return out


@probe(
    "trace-eval-grad",
    title="Does the script evaluate without building a graph (torch.no_grad / inference_mode)?",
    outcomes={"ok": "every evaluation forward ran with grad mode off",
              "grad-in-eval": "evaluation forwards ran with grad mode on (a graph per batch, never used)",
              "grad-into-fixed-model": "a model whose optimizer was not stepping (a distillation's teacher) ran with grad "
                                       "mode on inside another's training: its gradients were computed for nothing",
              "no-eval": "the script never evaluated"},
    timeout_s=10,
)
@_on_recording
def trace_eval_grad(ctx: ProbeContext, rec):
    objs = objectives(rec)
    if objs.idle_through:   # a fixed model (a distillation's teacher) run with grad on inside another's training
        text = idle_models_text(rec, objs)
        return failed("grad-into-fixed-model", f"{text}: that forward ran with grad mode on, and the backward computed "
                      f"gradients for parameters nothing updates (torch.no_grad() around it, or requires_grad_(False), "
                      f"is missing)", models=sorted({m for ms in objs.idle_through.values() for m in ms}))
    phases = _phases(rec)
    evals = [f for p in phases for f in p if rec.models[f.model].trainable]
    if not evals:
        return passed("the script never ran a forward without a backward: no evaluation to audit", "no-eval")
    bad = [f for f in evals if f.grad_enabled]
    data = dict(phases=len(phases), forwards=len(evals), grad_forwards=len(bad))
    # an evaluation: a phase of several forwards mostly with grad on, or every evaluation forward so (one
    # full-batch forward per evaluation); a lone prediction beside no_grad evaluation loops (a tutorial
    # showing four test images after training) builds one small graph and is not one
    looped = [p for p in phases if len(p) >= 2 and 2 * sum(f.grad_enabled for f in p) >= len(p)
              and any(rec.models[f.model].trainable for f in p)]
    if bad and (looped or len(bad) == len(evals)):
        return failed("grad-in-eval", f"{len(bad)} of {len(evals)} evaluation forwards ({len(phases)} phases) ran with "
                      f"grad mode on: each built an autograd graph nothing used (torch.no_grad() missing)", **data)
    if bad:
        return passed(f"{len(evals) - len(bad)} of {len(evals)} evaluation forwards ran with grad mode off; the other "
                      f"{len(bad)} ran alone with grad on (a one-off prediction outside an evaluation loop, one small "
                      f"graph)", **data)
    return passed(f"all {len(evals)} evaluation forwards ran with grad mode off", **data)


@probe(
    "trace-train-mode",
    title="Is the model back in training mode when the script trains after evaluating?",
    outcomes={"ok": "training forwards ran in training mode",
              "stays-eval": "after an evaluation phase, training forwards ran in eval mode",
              "eval-in-training": "training forwards ran in eval mode from the start",
              "no-mode-layers": "the model has no Dropout or BatchNorm module, so the mode changes only code that reads self.training"},
    timeout_s=10,
)
@_on_recording
def trace_train_mode(ctx: ProbeContext, rec):
    layered = _mode_models(rec)
    trained = [(i, f) for i, f in enumerate(rec.forwards) if f.trained and f.model in layered]
    if not trained:
        return passed("the trained model has no Dropout or BatchNorm module: train/eval mode changes only code that reads self.training", "no-mode-layers")
    phases = _phases(rec)
    first = phases[0][0] if phases else None
    first_eval = next((i for i, f in enumerate(rec.forwards) if f is first), None)
    before = [f for i, f in trained if first_eval is None or i < first_eval]
    after = [f for i, f in trained if first_eval is not None and i > first_eval]
    data = dict(before=len(before), after=len(after), eval_before=sum(not f.training for f in before),
                eval_after=sum(not f.training for f in after))
    if before and data["eval_before"] == len(before):
        return failed("eval-in-training", f"all {len(before)} training forwards ran with training=False from the start",
                      **data)
    if after and data["eval_after"] > len(after) / 2:
        parts = _mode_parts([layered[i] for i in {f.model for f in after}])
        return failed("stays-eval", f"after the first evaluation, {data['eval_after']} of {len(after)} training forwards "
                      f"ran with training=False (model.train() is not called again after model.eval()), so {parts} "
                      f"trained as in evaluation", **data)
    return passed(f"{len(before) + len(after)} training forwards ran in training mode"
                  + (f" ({len(after)} after an evaluation)" if after else ""), **data)


# ------------------------------------------------------------------------------------ schedule
@probe(
    "trace-scheduler",
    title="How often the script steps its learning-rate scheduler",
    outcomes={"ok": "the scheduler is stepped at the cadence it was designed for (or its intent is unknown)",
              "per-epoch-for-per-step": "a per-iteration schedule is stepped once per epoch",
              "per-step-for-per-epoch": "an epoch-based schedule is stepped every batch",
              "never-stepped": "the script never calls scheduler.step()",
              "no-scheduler": "the script builds no scheduler"},
    timeout_s=10,
)
@_on_recording
def trace_scheduler(ctx: ProbeContext, rec):
    from torch.optim import lr_scheduler as S

    from nnwizard.probes.schedule import intended_cadence

    if not rec.schedulers:
        return passed("the script builds no learning-rate scheduler", "no-scheduler")
    sched = rec.schedulers[0]
    obj, name = sched["object"], sched["name"]
    if isinstance(obj, S.ReduceLROnPlateau):
        return passed(f"{name} steps on a metric, not on a clock", steps=sched["steps"])
    train_loaders = [l for l in rec.loaders if any(b > 0 for b in l.backwards)]
    loader = train_loaders[0] if train_loaders else None
    epochs = sum(1 for b in loader.backwards if b > 0) if loader else 0
    completed = max(epochs - 1, 0) if rec.stopped else epochs
    loader_len = loader.length or 0 if loader else 0
    opt_steps = len(rec.steps)
    sched_steps = sched["steps"]
    intent, why = intended_cadence(obj, loader_len)
    if sched_steps == 0:
        observed = "none"
    elif opt_steps and sched_steps >= 0.8 * opt_steps:
        observed = "batch"
    elif sched_steps <= max(epochs, 1) + 1:
        observed = "epoch"
    else:
        observed = "other"
    lrs = [s.lrs[0] for s in rec.steps if s.lrs]
    data = dict(scheduler=name, intended=intent or "unknown", observed=observed, why=why, epochs=epochs,
                optimizer_steps=opt_steps, scheduler_steps=sched_steps, loader_batches=loader_len,
                lr_first=lrs[0] if lrs else math.nan, lr_last=lrs[-1] if lrs else math.nan)
    plot = [LinePlot("lr", f"{name}: learning rate at each optimizer.step() of the script", {"traced": lrs},
                     xlabel="optimizer step", ylabel="learning rate")] if lrs else []
    head = (f"the script stepped {name} {sched_steps} times over {opt_steps} optimizer steps in {epochs} epochs of "
            f"its training loader ({loader_len} batches each); LR {_fmt(data['lr_first'], '.3g')} -> {_fmt(data['lr_last'], '.3g')}")
    if observed == "none":
        written = _scheduler_steps_written(ctx.target, type(obj).__name__)
        if completed >= 1 and written:   # a call the run did not reach is not a missing call
            data["step_written_at"] = written
            return passed(f"{head}; scheduler.step() is written at {', '.join(written[:3])} but did not run within the "
                          f"observed run (a condition holds it back, such as a warm-up of several epochs), so its cadence "
                          f"could not be seen", artifacts=plot, **data)
        if completed >= 1:
            return failed("never-stepped", f"{head}: scheduler.step() is never called", plot, **data)
        return passed(f"{head}; no epoch finished within the budget, so a per-epoch step could not be seen yet", artifacts=plot, **data)
    if intent == "batch" and observed == "epoch":
        return failed("per-epoch-for-per-step", f"{head}; {why}", plot, **data)
    if intent == "epoch" and observed == "batch":
        return failed("per-step-for-per-epoch", f"{head}; {why}", plot, **data)
    return passed(f"{head}; {why}", artifacts=plot, **data)


def _scheduler_steps_written(target, cls: str) -> list[str]:
    """``file:line`` of each ``X.step(...)`` call in the script and its own modules whose receiver ``X`` is a
    scheduler: assigned from a call of its class ``cls`` (``self.scheduler = CosineAnnealingLR(...)``), or named
    like one (``sched``, ``lr_scheduler``: the factories that return a LambdaLR have other names)."""
    import ast

    script = getattr(target, "script", None)
    run = getattr(target, "run", None)
    files = ([script.path] if script is not None and script.path else []) + list(getattr(run, "own_files", []) or [])
    found = []
    for path in dict.fromkeys(files):
        try:
            tree = ast.parse(Path(path).read_text(encoding="utf-8", errors="replace"))
        except (OSError, SyntaxError, ValueError):
            continue
        held = set()
        for node in ast.walk(tree):
            value = getattr(node, "value", None)
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(value, ast.Call):
                fn = value.func
                if (fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)) == cls:
                    held.update(ast.unparse(t) for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "step":
                receiver = ast.unparse(node.func.value)
                if receiver in held or "sched" in receiver.lower():
                    found.append(f"{Path(path).name}:{node.lineno}")
    return found


# ------------------------------------------------------------------------------------ loss
@probe(
    "trace-loss-scale",
    title="Gradient scale of the script's steps: the losses backward() saw against the loss values",
    outcomes={"ok": "each optimizer step applies the gradient of one mean-reduced loss",
              "accumulated-sum": "several losses are backpropagated per step without dividing: the step applies their sum",
              "sum-reduction": "the loss sums over the samples (reduction='sum') and is not divided"},
    timeout_s=10,
)
@_on_recording
def trace_loss_scale(ctx: ProbeContext, rec):
    calls = [c for c in rec.loss_calls if not c.eval and c.value is not None and math.isfinite(c.value)]
    if not rec.steps or not calls:
        return skipped("no optimizer step with a recorded loss call")
    ratios, windows = [], []
    for s in rec.steps:
        window = [c for c in calls if c.step == s.step - 1]
        if s.closure or not window or not s.losses or len({(c.fn, tuple(c.input_shape[1:])) for c in window}) != 1:
            continue
        if len(window) > 1 and s.backwards < 2:
            continue  # several loss terms summed into one backward (an episode's per-step losses): one objective
        mean = sum(c.value for c in window) / len(window)
        if abs(mean) < 1e-12 or len({c.where for c in window}) > 1:
            continue  # losses from different lines are terms of one objective (a GAN's real and fake halves), not accumulation
        ratios.append(sum(s.losses) / mean)
        windows.append(len(window))
    if not ratios:
        return skipped("no step whose backward losses can be compared with its loss calls")
    ratio = sorted(ratios)[len(ratios) // 2]
    k = sorted(windows)[len(windows) // 2]
    first = calls[0]
    batch = first.input_shape[0] if first.input_shape else 0
    data = dict(ratio=ratio, loss_calls_per_step=k, reduction=first.reduction, batch_size=batch, fn=first.fn)
    if first.reduction == "sum" and 0.8 < ratio < 1.25 * max(k, 1) and batch > 1:
        return failed("sum-reduction", f"{first.fn} is called with reduction='sum' over batches of {batch} and the "
                      f"summed value is what backward() gets: gradients (and the effective learning rate) grow {batch}x "
                      f"with the batch size", **data)
    if ratio >= 1.8 and k >= 2:
        return failed("accumulated-sum", f"each optimizer step backpropagates {ratio:.2f}x the mean of its {k} loss calls: "
                      f"the {k} losses per step are summed, not averaged, so the step applies {ratio:.1f}x the "
                      f"mean-reduced gradient", **data)
    return passed(f"each optimizer step backpropagates {ratio:.2f}x the mean of its {k} loss call(s) ({first.fn}, "
                  f"reduction {first.reduction})", **data)


NEGATED = -0.5       # median backward value over its loss call's below this: the step climbs that loss
NEGATED_MAX = 2.0    # (down to -2x: the loss negated, perhaps scaled; beyond, another term of the objective dominates)
ASCENT_COS = 0.5     # median cosine of a hand-written update with the gradient above this: it climbs
COOPERATING = 0.35   # competing objectives that both end below this share of their first value agree
OWN_VALUE = 0.1      # backward values within this of 1x their loss call's value on every step: the loss function's own


@probe(
    "trace-loss-sign",
    title="Does the script minimise its loss, or climb it (a flipped sign)?",
    outcomes={"ok": "the backpropagated loss is the loss function's value, or a bounded objective",
              "negated": "backward() gets the negative of a loss function's non-negative value: gradient ascent on it",
              "unbounded": "a hand-written objective below zero falls faster and faster as the gradients grow: it has "
                           "no lower bound (a log-likelihood maximised the wrong way, a score difference reversed)",
              "ascent": "a hand-written update moves the parameters along their gradient (p += lr * grad): it climbs the loss",
              "cooperating": "two competing objectives (a GAN) both fall steeply together: one side is trained towards "
                             "what the other wants"},
    timeout_s=10,
)
@_on_recording
def trace_loss_sign(ctx: ProbeContext, rec):
    if not rec.steps:
        return skipped("no optimizer step was recorded")
    cosines = [st.update_cos for st in rec.steps if st.manual and st.update_cos is not None]
    if len(cosines) >= 3 and sorted(cosines)[len(cosines) // 2] > ASCENT_COS:
        cos = sorted(cosines)[len(cosines) // 2]
        return failed("ascent", f"the hand-written update moves the parameters along their gradient, not against it "
                      f"(cosine of update and gradient {cos:+.2f}, median over {len(cosines)} steps; descent gives -1): "
                      f"p += lr * grad where p -= lr * grad belongs, so every step makes the loss larger", cos=cos,
                      steps=len(cosines))
    objs = objectives(rec)
    if objs.adversarial:
        ends = {}
        for key, losses in objs.series.items():
            if len(losses) < UNBOUNDED_MIN or not all(math.isfinite(v) for v in losses) or losses[0] <= 0:
                break
            ends[key] = (losses[0], statistics.median(losses[-max(len(losses) // 3, 1):]))
        else:
            if ends and all(end <= COOPERATING * first for first, end in ends.values()):
                told = "; ".join(f"{optimizer_label(rec, k)}'s loss {a:.3g} -> {b:.3g}" for k, (a, b) in ends.items())
                return failed("cooperating", f"the competing objectives both fall steeply together ({told}): in a real "
                              f"contest one side's loss rises as the other's falls; here one model is trained towards "
                              f"what the other wants (a generator scored against the fake labels, or its loss's sign "
                              f"reversed)", ends={optimizer_label(rec, k): v for k, v in ends.items()})
        return skipped(adversarial_reason(objs))
    calls = [c for c in rec.loss_calls if not c.eval and c.value is not None and math.isfinite(c.value)]
    ratios = []
    for st in rec.steps:
        window = [c for c in calls if c.step == st.step - 1]
        if st.closure or len(window) != 1 or len(st.losses) != 1 or abs(window[0].value) <= 1e-12:
            continue
        ratios.append(st.losses[0] / window[0].value)
    # backward() got a torch loss function's own value on every step: its sign is that function's; a value
    # below zero falling without bound comes from an input of the wrong form (nll_loss on raw logits), which
    # trace-loss-input judges, not from the objective's sign
    own = len(ratios) >= 3 and all(abs(r - 1) <= OWN_VALUE for r in ratios)
    if len(ratios) >= 3 and all(c.value >= 0 for c in calls):
        ratio = sorted(ratios)[len(ratios) // 2]
        first = calls[0]
        data = dict(ratio=ratio, fn=first.fn, where=first.where or "?", steps=len(ratios))
        if -NEGATED_MAX <= ratio < NEGATED:   # (far beyond -1: another term dominates; judged on the curve below)
            return failed("negated", f"backward() gets {ratio:.2f}x the value of {first.fn} at {data['where']} (median over "
                          f"{len(ratios)} steps): {first.fn} is never negative, so each step moves the model to make it "
                          f"larger, not smaller (gradient ascent)", **data)
    for key, losses in objs.series.items() if not own else ():
        # read up to the first non-finite value: the loss's, or a measured gradient norm's (past it the values
        # saturate at the float range, and a curve that stops falling there is not bounded)
        points = [x for x in rec.steps if x.loss is not None and (key is None or (x.optimizer == key and x.backwards > 0))]
        cut = next((i for i, (v, x) in enumerate(zip(losses, points)) if not math.isfinite(v)
                    or (x.grad_norm is not None and not math.isfinite(x.grad_norm))), len(losses))
        losses = losses[:cut]
        thirds = falls_unbounded(losses)
        if thirds is None:
            continue
        a, b, c = thirds
        n = len(losses)
        own = [x for x in rec.steps if (key is None or x.optimizer == key) and x.grad_norm is not None]
        blew = any(not math.isfinite(x.grad_norm) for x in own)
        norms = [x.grad_norm for x in own if math.isfinite(x.grad_norm)]
        k = max(len(norms) // 3, 1)
        grew = statistics.median(norms[-k:]) / max(statistics.median(norms[:k]), 1e-30) if len(norms) >= 6 else None
        if grew is None or grew >= 1.5:
            whose = f"{optimizer_label(rec, key)}'s loss" if key is not None else "the loss"
            growth = (f", while the gradient norm grew {grew:.3g}x" if grew is not None else "") + \
                (" and then turned non-finite" if blew else "")
            return failed("unbounded", f"{whose} is below zero and falls faster and faster: medians {a:.4g}, {b:.4g}, "
                          f"{c:.4g} over the three thirds of {n} steps{growth}; a loss that is bounded below slows down "
                          f"as it nears its minimum, this one has none (the objective is maximised the wrong way round)",
                          first=a, middle=b, last=c, grad_growth=grew, steps=n)
    return passed("the backpropagated losses are the loss functions' own values or a bounded objective"
                  + (f" ({sorted(ratios)[len(ratios) // 2]:.2f}x {calls[0].fn})" if len(ratios) >= 3 else ""))


@probe(
    "trace-loss-target",
    title="Does the script's loss compare the model's output with the real targets?",
    outcomes={"ok": "the loss input comes from the model and the target is not derived from it",
              "target-from-output": "the loss target is the model's own output (detached, or its argmax)",
              "not-from-model": "the loss input does not come from the model's output",
              "target-carries-grad": "the loss target is computed by the same model with grad on: the gradient also "
                                     "moves the target (a TD target, a stop-gradient branch, not detached)"},
    timeout_s=10,
)
@_on_recording
def trace_loss_target(ctx: ProbeContext, rec):
    calls = _train_calls(rec)
    if not calls:
        return skipped("no loss call reached by a backward was recorded")
    watched = [c for c in calls if c.watched]   # (the target's provenance is followed on the graph mode's steps)
    own = [c for c in watched if c.target_is_output]
    foreign = [c for c in calls if not c.from_model]
    data = dict(calls=len(calls), followed=len(watched), target_from_output=len(own), not_from_model=len(foreign), fn=calls[0].fn,
                where=(own or foreign or calls)[0].where or "?")
    if len(own) > len(watched) / 2:
        followed = f" whose target was followed ({len(calls)} in all)" if len(watched) < len(calls) else ""
        return failed("target-from-output", f"in {len(own)} of {len(watched)} training loss calls{followed} ({calls[0].fn} at "
                      f"{data['where']}) the target equals the model's own output (detached or its argmax): the loss "
                      f"pulls the model towards what it already predicts", **data)
    # per call site and function: a consistency term beside a supervised one (Mean Teacher) is half the calls, all its own
    by_site: dict = {}
    for c in calls:
        by_site.setdefault((c.where, c.fn), []).append(c)
    site = next((cs for cs in by_site.values() if sum(c.target_grad for c in cs) > len(cs) / 2), None)
    if site is not None:
        carried = [c for c in site if c.target_grad]
        data.update(target_grad=len(carried), where=carried[0].where or "?")
        return failed("target-carries-grad", f"in {len(carried)} of {len(site)} training loss calls ({carried[0].fn} at "
                      f"{data['where']}) the target was computed by the same model with grad mode on: the backward runs "
                      f"through the target too, so each step also moves what the model is asked to match", **data)
    if len(foreign) > len(calls) / 2:
        return failed("not-from-model", f"in {len(foreign)} of {len(calls)} training loss calls ({calls[0].fn} at "
                      f"{data['where']}) the input is not computed from the model's output", **data)
    return passed(f"all {len(calls)} training loss calls ({calls[0].fn}) take the model's output and a separate target", **data)


@probe(
    "trace-graph",
    title="Does the script keep loss tensors (and their graphs) alive across steps?",
    outcomes={"ok": "no loss tensor outlives its step",
              "spans": "a backward ran through the graph of an earlier step (a carried tensor was not detached)",
              "kept": "arithmetic on a backpropagated loss made a graph that lives on (total += loss)",
              "stored": "backpropagated loss tensors pile up (appended to a list instead of .item())"},
    timeout_s=10,
)
@_on_recording
def trace_graph(ctx: ProbeContext, rec):
    if rec.mode != "full" or not rec.steps:
        return skipped("needs a full recording with optimizer steps")
    alive = rec.alive_losses
    data = dict(kept=", ".join(rec.graph_kept[:3]), alive_last=alive[-1] if alive else 0, steps=len(rec.steps))
    if rec.graph_spans:
        freed = rec.error is not None and "backward through the graph a second time" in rec.error.message
        data.update(spans=", ".join(rec.graph_spans[:3]), raised=freed)
        return failed("spans", f"the backward at {rec.graph_spans[0]} reached the graph of a model forward made before "
                      f"the previous optimizer.step(): a tensor carried over from the earlier step (an RNN hidden state, a "
                      f"cached output) still holds that step's graph"
                      + (", so backward() raised 'Trying to backward through the graph a second time'" if freed else
                         ", so every step backpropagates through all the steps before it")
                      + "; detach it at each step (hidden = hidden.detach())", **data)
    if rec.graph_kept:
        return failed("kept", f"a loss tensor whose backward already ran was used in arithmetic that keeps a graph "
                      f"alive into the next step ({data['kept']}): accumulate loss.item() instead", **data)
    streak, best, peak_at = 0, 0, 0
    for i in range(1, len(alive)):
        streak = streak + 1 if alive[i] > alive[i - 1] else 0
        if streak > best:
            best, peak_at = streak, i
    if best >= 3 and max(alive) >= 3:
        return failed("stored", f"{alive[peak_at]} loss tensors whose backward already ran were still referenced at step "
                      f"{peak_at + 1}, one more after every step for {best} steps: they are kept (e.g. appended to a list "
                      f"instead of loss.item()) with their graphs", **data)
    if len(rec.steps) < 2:   # a graph carried into the next step shows at that step's backward
        return skipped(f"one optimizer step recorded: a graph kept across steps shows from the second", **data)
    return passed(f"no backpropagated loss outlived its step over {len(rec.steps)} steps", **data)


# ------------------------------------------------------------------------------------ fresh data
STALE_MIN = 8   # training forwards (and optimizer steps) recorded before one repeated input counts


def _arg_text(fp: tuple) -> str:
    shape, dtype, _ = fp[0]
    return f"argument 0, shape {list(shape)} {dtype.replace('torch.', '')}"


@probe(
    "trace-stale-batch",
    title="Does each training step get new data, or the same batch again?",
    outcomes={"ok": "the training forwards took different inputs",
              "full-batch": "one input at every step, and no other batch of its shape was seen: full-batch training",
              "same-batch": "every training step took the same input while the data source yields other batches"},
    timeout_s=10,
)
@_on_recording
def trace_stale_batch(ctx: ProbeContext, rec):
    from nnwizard.recorder import _tensors, fingerprint

    if rec.mode != "full" or len(rec.steps) < STALE_MIN:
        return skipped(f"needs a full recording of at least {STALE_MIN} optimizer steps")
    trained = {m for s in rec.steps for m in s.forwards}
    loader = {fp for fp in map(fingerprint, rec.batches) if fp is not None}
    # DataLoaders of two batches or more that served one batch in the whole run, and that batch's first tensor
    once = [info for info in rec.loaders if sum(info.batches) == 1 and (info.length is None or info.length >= 2)]
    drawn = {fingerprint(next(_tensors(b), None)) for b in rec.batches} if once else set()
    judged = []
    for info in rec.models:
        if info.index not in trained:
            continue
        seen = [fingerprint(a) for i, a in rec.model_inputs if i == info.index]
        if len(seen) < STALE_MIN or None in seen:
            continue
        judged.append(info.name)
        if len(set(seen)) > 1:
            continue
        first = seen[0]
        shape = first[0][0]
        other = {fp for i, fp in rec.eval_inputs if i == info.index and fp is not None and fp[0][0] == shape and fp != first}
        data = dict(model=info.name, forwards=len(seen), steps=len(rec.steps), eval_batches=len(other),
                    loader_batches=len(loader), argument=_arg_text(first))
        inputs = next((a for i, a in rec.model_inputs if i == info.index), ())
        from_once = bool(drawn) and fingerprint(next(_tensors(inputs), None)) in drawn
        if len(other) >= 2 or len(loader) >= 2 or from_once:
            if len(other) >= 2:
                recorded = sum(1 for i, _ in rec.eval_inputs if i == info.index)
                source = (f"{len(other)} of the first {recorded} evaluation forwards of {info.name} the recording kept took "
                          f"other inputs of that shape")
            elif len(loader) >= 2:
                source = f"its DataLoader yielded {len(loader)} different batches"
            else:
                sizes = ", ".join(f"{l.length:,}" if l.length is not None else "unknown" for l in once)
                source = f"it is the one batch the script drew from a DataLoader of {sizes} batches in the whole run"
                data["drawn_once"] = True
            return failed("same-batch", f"all {len(seen)} recorded training forwards of {info.name} took one identical input "
                          f"({data['argument']}) over {len(rec.steps)} optimizer steps, while {source}: the loop trains "
                          f"on one batch, fetched once, at every step", **data)
        return passed(f"all {len(seen)} recorded training forwards of {info.name} took one identical input "
                      f"({data['argument']}), and no other batch of that shape was seen: full-batch training",
                      "full-batch", **data)
    if not judged:
        return skipped(f"fewer than {STALE_MIN} training forwards of a trained model were recorded")
    return passed(f"the recorded training forwards of {', '.join(judged)} took different inputs from step to step",
                  models=judged)


# ------------------------------------------------------------------------------------ failures
@probe(
    "trace-nan",
    title="The first non-finite loss or gradient in the script's run",
    outcomes={"ok": "every recorded loss and gradient is finite",
              "nan-input": "the model's input was already non-finite at that step",
              "nan-after-growth": "the gradient norm grew over the steps before the loss turned non-finite",
              "nan-at-start": "non-finite from the first step, before any update",
              "nan": "non-finite at a later step without a growing gradient",
              "spike": "finite, but the loss jumped over 100x its first value within the run",
              "spike-carry-over": "the loss jumped over 100x while gradients were never cleared between steps"},
    timeout_s=10,
)
@_on_recording
def trace_nan(ctx: ProbeContext, rec):
    if not rec.steps:
        return skipped("no optimizer step was recorded")
    bad = next((s for s in rec.steps if (s.loss is not None and not math.isfinite(s.loss)) or s.grads_nonfinite
                or s.nonfinite_input), None)
    if bad is None:
        objs = objectives(rec)
        # a spike is read on each objective's own curve; an adversarial objective's loss need not fall (no spike test)
        for key, losses in ({} if objs.adversarial else objs.series).items():
            if len(losses) < 4 or losses[0] <= 0:
                continue
            peak = max(range(len(losses)), key=lambda i: losses[i])
            if losses[peak] <= 100 * losses[0]:
                continue
            own = [x for x in rec.steps if key is None or x.optimizer == key]
            whose = f"{optimizer_label(rec, key)}'s own loss" if key is not None else "the loss"
            at = [x.step for x in own if x.loss is not None]
            first_lr = next((x.lrs[0] for x in own if x.lrs), None)
            carried = [x.carried for x in own[1:] if x.carried is not None]
            if carried and sum(carried) / len(carried) > 0.5:  # the steps grew because gradients piled up
                return failed("spike-carry-over", f"{whose} jumped from {losses[0]:.4g} at step {at[0]} to {losses[peak]:.4g} "
                              f"at step {at[peak]} ({losses[peak] / losses[0]:.3g}x): the gradients were never cleared "
                              f"between steps (trace-zero-grad), so each update applied the sum of all earlier "
                              f"gradients; the learning rate is not what to change first", step=at[peak],
                              first=losses[0], peak=losses[peak], last=losses[-1])
            return failed("spike", f"{whose} jumped from {losses[0]:.4g} at step {at[0]} to {losses[peak]:.4g} at step "
                          f"{at[peak]} ({losses[peak] / losses[0]:.3g}x) and ended at {losses[-1]:.4g}: updates far too "
                          f"large for this model (lr {_fmt(first_lr, '.3g')})",
                          step=at[peak], first=losses[0], peak=losses[peak], last=losses[-1])
        return passed(f"all {len(rec.steps)} recorded losses and gradient norms are finite")
    k = bad.step
    before = [s for s in rec.steps if s.step < k and s.grad_norm is not None and math.isfinite(s.grad_norm)]
    # the largest norm before the non-finite step, not the last one: a run can blow up, fall back to a garbage
    # level (a saturated output layer) and turn non-finite only much later
    peak = max(before, key=lambda s: s.grad_norm) if before else None
    growth = peak.grad_norm / max(before[0].grad_norm, 1e-30) if len(before) >= 2 else None
    data = dict(step=k, epoch=bad.epoch, batch=bad.batch, loss=bad.loss, grad_norm=bad.grad_norm,
                growth=growth, lr=bad.lrs[0] if bad.lrs else None, input_nonfinite=bad.nonfinite_input)
    where = f"step {k} (epoch {bad.epoch}, batch {bad.batch})" if bad.batch >= 0 else f"step {k}"
    if bad.nonfinite_input:
        return failed("nan-input", f"at {where} the model's input already held NaN/Inf values", **data)
    if k == 1:
        return failed("nan-at-start", f"the loss/gradient was non-finite at the first step, before any update "
                      f"(loss {_fmt(bad.loss)})", **data)
    if growth is not None and growth > 10:
        rose = (f"grew {growth:.3g}x over the {len(before)} steps before" if peak is before[-1] else
                f"grew {growth:.3g}x by step {peak.step} (then {_fmt(before[-1].grad_norm, '.3g')} at step {before[-1].step})")
        return failed("nan-after-growth", f"the loss turned non-finite at {where} after the gradient norm {rose} "
                      f"(lr {_fmt(data['lr'], '.3g')})", **data)
    return failed("nan", f"the loss turned non-finite at {where} (gradient norm before it {_fmt(before[-1].grad_norm if before else None, '.3g')})",
                  **data)


CRASH_IDS = ("target-shape-mismatch", "no-parameters", "module-method-shadowed", "op-shape-mismatch", "dtype-mismatch",
             "device-mismatch", "labels-wrong-dtype", "labels-out-of-range", "layer-shape-mismatch", "inplace-modification",
             "graph-retained", "disconnected-parameters", "frozen-parameters", "loss-output-mismatch", "axes-swapped")


@probe(
    "trace-crash",
    title="The exception the script raised, where, and what it is evidence for",
    outcomes={"ok": "the script did not raise", "other": "an exception the classifier cannot attribute",
              **{h: f"the exception is evidence for {h}" for h in CRASH_IDS}},
    timeout_s=10,
)
@_on_recording
def trace_crash(ctx: ProbeContext, rec):
    from nnwizard.probes._crash import classify_exception

    err = rec.error
    if err is None:
        return passed("the script ran without raising")
    target = ctx.target
    info = getattr(target, "model_info", None)
    files = _project_files(target, err.exception)
    data: dict[str, Any] = dict(error=f"{err.type}: {err.message}", step=err.step)
    hypothesis, sentence = None, ""
    if err.exception is not None:
        try:
            targets = rec.failed_loss[1] if rec.failed_loss else None
            c = classify_exception(err.exception, model=info.module if info else None, files=files, targets=targets)
            data.update({k: v for k, v in c.as_dict().items() if k not in ("hypothesis",)})
            hypothesis, sentence = c.hypothesis, c.sentence or ""
        except Exception as exc:  # noqa: BLE001 - the classifier failing leaves the raw exception as the evidence
            data["classifier_error"] = f"{type(exc).__name__}: {exc}"
    data["where"] = data.get("where") or err.where or "?"   # (the innermost frame in the project's files)
    text = f"the script raised at {data['where']} after {err.step} optimizer steps: {data['error']}"
    if hypothesis is None and err.exception is not None and _raised_in_layer(err.exception):
        hypothesis = "layer-shape-mismatch"
        sentence = f"it raised inside the forward of a torch layer ({_raised_in_layer(err.exception)})"
    if hypothesis in CRASH_IDS:
        data["crash_hypothesis"] = hypothesis
        return failed(hypothesis, f"{text}; {sentence}" if sentence and sentence not in text else text, **data)
    data["training_raised"] = True
    if data.get("code"):   # no known kind: the statement that raised and what it was given are the evidence
        shown = [f"{o['name']} {o.get('dtype', '')}{list(o['shape']) if o.get('shape') is not None else ''}"
                 for o in data.get("operands") or [] if isinstance(o, dict) and o.get("name")]
        text += f"; the statement `{data['code']}`" + (f" was given {', '.join(shown)}" if shown else "")
    return failed("other", text, **data)


def _project_files(target, exc) -> list | None:
    """The user's files a crash is read in: the script, and the files of its traceback that lie in the script's
    folder outside installed packages (the project's own modules: a script's ``from utils.dice import dice_loss``
    raising there is read there, not at the script's call of it). None (anything outside torch, site-packages
    and nnwizard) without a script."""
    script = getattr(target, "script", None)
    if script is None or script.path is None:
        return None
    files = [script.path]
    folder = Path(script.folder).resolve()
    tb = getattr(exc, "__traceback__", None)
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        path = Path(name).resolve() if not name.startswith("<") else None
        if path is not None and path.suffix == ".py" and folder in path.parents and "site-packages" not in path.parts \
                and not any(part.startswith(".venv") or part == "venv" for part in path.relative_to(folder).parts):
            files.append(path)
        tb = tb.tb_next
    return files


@probe(
    "trace-loss-input",
    title="Is what the script feeds its loss what that loss expects (logits, log-probabilities, probabilities)?",
    outcomes={"ok": "the loss inputs have the form the loss expects",
              "double-softmax": "cross_entropy gets probabilities (rows in [0, 1] summing to 1): softmax applied twice",
              "probs-to-nll": "nll_loss gets probabilities instead of log-probabilities",
              "logits-to-nll": "nll_loss gets raw logits instead of log-probabilities",
              "other-dim": "nll_loss gets log-probabilities normalised over another dimension (log_softmax(dim=0))",
              "double-sigmoid": "binary_cross_entropy_with_logits gets values already squashed into [0, 1]",
              "clamped-logits": "a loss that wants logits gets values clamped at 0 from below (a ReLU after the last layer)",
              "squashed-logits": "cross_entropy gets values bounded in [0, 1] that are not probabilities (a sigmoid on the logits)"},
    timeout_s=10,
)
@_on_recording
def trace_loss_input(ctx: ProbeContext, rec):
    import torch

    calls = [c for c in rec.loss_calls if c.inputs is not None and isinstance(c.inputs, torch.Tensor)
             and c.inputs.is_floating_point() and c.inputs.numel()]
    if not calls:
        return skipped("no loss input was captured")
    sites: dict[tuple, list] = {}   # each call site and model on its own: a second phase's loss (a student after its
    for c in calls:                  # teacher, a distillation loop) is not pooled with the first phase's
        sites.setdefault((c.fn, c.where, c.model), []).append(c)
    names = {m.index: m.name for m in rec.models}
    models = {m for _, _, m in sites}

    def label(where, model):   # "" with one site; else where the calls were made, and for which model
        if len(sites) == 1:
            return ""
        return (f" at {where}" if where else "") + (f" on {names[model]}'s output" if len(models) > 1 and model in names else "")

    results = [_loss_input(group, label(where, model)) for (_, where, model), group in sites.items()]
    return next((r for r in results if r.status == "failed"), results[0])


def _loss_input(calls: list, at: str):
    """trace-loss-input's reading of the calls of one loss call site and model (``at`` names them when there are
    several)."""
    import torch

    call = calls[0]
    x = torch.cat([_class_rows(c.inputs.float()) for c in calls
                   if c.fn == call.fn and c.inputs.dim() == call.inputs.dim() and c.inputs.shape[1:] == call.inputs.shape[1:]])
    data: dict[str, Any] = dict(fn=call.fn, rows=len(x), min=float(x.min()), max=float(x.max()))
    if at:
        data["call_site"] = at.strip()
    if call.fn in ("cross_entropy", "nll_loss") and x.dim() == 2 and x.shape[1] >= 2:
        sums = x.sum(1)
        probs = bool((x >= 0).all() and (x <= 1).all() and ((sums - 1).abs() < 1e-3).all())
        lse = torch.logsumexp(x, 1)
        data.update(row_sum_mean=float(sums.mean()), logsumexp_mean=float(lse.mean()))
        if probs and call.fn == "cross_entropy":
            return failed("double-softmax", f"all {len(x)} rows {call.fn} received{at} are probabilities (in [0, 1], summing "
                          f"to 1): the model already applies softmax and cross_entropy applies log_softmax again, "
                          f"which flattens the gradient", **data)
        if call.fn == "nll_loss" and probs:
            return failed("probs-to-nll", f"nll_loss received{at} probabilities (rows sum to 1, values in [0, 1]) where it "
                          f"needs log-probabilities (log_softmax)", **data)
        if call.fn == "nll_loss" and data["max"] <= 0 and bool((lse < -0.1).all()) and len(x) >= 8:
            # log-probabilities (none above 0) whose rows hold less than all the probability: the log_softmax
            # ran over another dimension (the samples), each column summing to one over the whole batch
            return failed("other-dim", f"nll_loss received{at} log-probabilities (none above 0) whose rows' probabilities sum "
                          f"to {math.exp(float(lse.mean())):.3g} on average, not 1: the log_softmax normalised another "
                          f"dimension (the samples), not the classes", **data)
        if call.fn == "nll_loss" and (lse - 0).abs().mean() > 0.1:
            return failed("logits-to-nll", f"nll_loss received{at} rows whose logsumexp is {float(lse.mean()):.3g}, not 0: raw "
                          f"logits where it needs log_softmax outputs", **data)
        if call.fn == "cross_entropy" and not probs and x.numel() >= MIN_LOGITS:
            clamped = _clamped(x, call.fn, data)
            if clamped is not None:
                return clamped
            if data["min"] >= 0 and data["max"] <= 1:
                c = x.shape[1]
                floor = math.log(1 + (c - 1) / math.e)
                data.update(classes=c, loss_floor=round(floor, 4))
                return failed("squashed-logits", f"all {len(x)} rows cross_entropy received{at} lie in [{data['min']:.3g}, "
                              f"{data['max']:.3g}] without summing to 1: the logits are squashed (a sigmoid on them, or a "
                              f"scale that shrinks them, such as a temperature far too large) before a loss "
                              f"that applies its own softmax, so it cannot fall below ln(1 + {c - 1}/e) = {floor:.3f} even "
                              f"when every prediction is right", **data)
    if call.fn == "binary_cross_entropy_with_logits" and x.numel() >= MIN_LOGITS:
        clamped = _clamped(x, call.fn, data)
        if clamped is not None:
            return clamped
    if call.fn == "binary_cross_entropy_with_logits" and bool((x >= 0).all() and (x <= 1).all()) and len(x) >= 8:
        return failed("double-sigmoid", f"binary_cross_entropy_with_logits received{at} only values in [0, 1] (min "
                      f"{data['min']:.3g}, max {data['max']:.3g}): a sigmoid was applied before a loss that applies its own",
                      **data)
    return passed(f"{call.fn}{at} receives inputs of the form it expects ({len(x)} rows, range {data['min']:.3g} .. {data['max']:.3g})",
                  **data)


MIN_LOGITS = 64        # values a loss must have received before their range says what produced them


def _class_rows(t):
    """A loss input as one row per prediction, the classes along the row: (N, C) as it is, (N, C, d1, ...)
    (a segmentation map, a sequence's logits kept channel-first) with its class dimension 1 moved last."""
    if t.dim() > 2:
        return t.movedim(1, -1).reshape(-1, t.shape[1])
    return t.reshape(-1, t.shape[1] if t.dim() > 1 else 1)


def _clamped(x, fn: str, data: dict):
    """Logits with no value below 0 and many exactly 0: a ReLU (or a clamp) after the last layer, so a
    score can never go negative and every clamped one passes no gradient (None: not so)."""
    zeros = float((x == 0).float().mean())
    data["zero_share"] = round(zeros, 4)
    if not clamped(x, zeros):
        return None
    cost = ("a class score can never fall below 0, so the model can only raise the right class, never lower the "
            "others" if fn == "cross_entropy" else "no prediction can fall below probability 0.5")
    return failed("clamped-logits", f"{fn} received {x.numel()} values, none below 0 and {zeros:.0%} exactly 0: the "
                  f"logits pass through a ReLU (or a clamp) before a loss that wants them unbounded; {cost}, and the "
                  f"scores held at 0 pass no gradient back", **data)


_LAYER_FILES = ("conv.py", "linear.py", "pooling.py", "batchnorm.py", "normalization.py", "rnn.py", "sparse.py",
                "transformer.py", "activation.py", "flatten.py")


def _raised_in_layer(exc: BaseException) -> str | None:
    """The torch layer file whose forward raised a size complaint (a classifier fallback)."""
    import traceback

    text = str(exc).lower()
    if not isinstance(exc, RuntimeError) or not any(w in text for w in ("size", "shape", "dimension", "channels")):
        return None
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if "/torch/nn/modules/" in frame.filename:
            name = frame.filename.rsplit("/", 1)[-1]
            return name.removesuffix(".py") if name in _LAYER_FILES else None
    return None
