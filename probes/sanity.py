"""The four sanity probes every diagnosis starts from: what the model is, whether one forward pass
and loss run, whether the untrained loss is what arithmetic predicts, and whether one small batch
can be overfit through the user's own optimizer and step."""

from __future__ import annotations

import math
import time

import torch

from nnwizard.budget import SMALL_SLICE
from nnwizard.probes._crash import classify_exception, error_kind, expected_input
from nnwizard.record.frames import first_line, user_frame
from nnwizard.record.tracers import anomaly_origin, trace_modules
from nnwizard.probes.modes import steady_train_mode
from nnwizard.probes.registration import attribute_findings
from nnwizard.probes.api import LinePlot, ProbeContext, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.target import LossNotReplayable, user_source_files


MIN_OVERFIT_STEPS = 20  # below this a healthy model rarely memorises 16 samples; the probe is skipped
CLEAR_DROP = 0.02       # when the budget cuts the run: a loss below 2% of its start is a clear outcome
CHECK_EVERY = 5         # ... checked every 5 steps: a check is one forward (a third of a step), at most 7% more
# A classification batch is memorised when every sample is predicted right and the loss is below this part of its
# start. A loss with a floor also reaches full accuracy (probabilities fed to CrossEntropyLoss, a sigmoid fed to
# BCEWithLogitsLoss), but it cannot fall below ln(1 + (C-1)/e) / ln(C) >= 0.45 of its chance-level start, for any
# number of classes C: those stay "slow" (a third leaves them a clear margin).
MEMORISED = 1 / 3


def _count(params) -> int:
    return sum(p.numel() for p in params)


@probe(
    "model-summary",
    title="Architecture, parameter and trainable counts",
    outcomes={"ok": "every parameter trains", "partly-frozen": "some parameters have requires_grad=False",
              "all-frozen": "no parameter requires grad", "no-parameters": "the model registers no parameters"},
    timeout_s=30,
)
def model_summary(ctx: ProbeContext):
    model = ctx.target.fresh_model(ctx.seed)
    params = list(model.parameters())
    total, trainable = _count(params), _count(p for p in params if p.requires_grad)
    frozen = sorted({name.rsplit(".", 1)[0] for name, p in model.named_parameters() if not p.requires_grad})
    rows = []
    for name, child in model.named_children():
        n = _count(child.parameters())
        t = _count(p for p in child.parameters() if p.requires_grad)
        rows.append([name, type(child).__name__, n, t])
    table = Table("modules", "Top-level modules", ["module", "type", "parameters", "trainable"], rows,
                  marked=[i for i, r in enumerate(rows) if r[2] and not r[3]])
    modules = len(list(model.modules()))
    data = dict(total=total, trainable=trainable, frozen_modules=frozen, model=type(model).__name__,
                modules=modules, modules_s="" if modules == 1 else "s",
                frozen_fraction=round(1 - trainable / total, 4) if total else 0.0)
    if total == 0:  # layers or tensors the model holds outside nn.Module's registries
        held = attribute_findings(model, set())
        data.update(held_outside=len(held), held_names=", ".join(h["attribute"] for h in held[:4]) or "none")
    head = f"{type(model).__name__}: {total:,} parameters, {trainable:,} trainable"
    if total == 0:
        return failed("no-parameters", f"{type(model).__name__} registers no parameters at all", **data)
    if trainable == 0:
        return failed("all-frozen", f"{head}: every parameter has requires_grad=False", [table], **data)
    if frozen:
        return passed(f"{head}; frozen: {', '.join(frozen[:5])}", "partly-frozen", [table], **data)
    return passed(head, artifacts=[table], **data)


@probe(
    "forward-shape",
    title="One forward pass and loss on a real batch",
    outcomes={
        "ok": "forward and loss ran; output and target shapes fit",
        "layer-shape": "a layer raised because its input has the wrong shape",
        "forward-error": "the forward pass raised for another reason",
        "loss-dtype": "the loss raised on the targets' dtype",
        "label-range": "the loss raised on a class index out of range",
        "loss-shape": "the loss raised on output/target shapes",
        "loss-error": "the loss raised for another reason",
        "broadcast": "output and target shapes differ but broadcast silently in the loss",
        "forward-only": "the forward ran; the loss took a selection of the output that depends on the batch and is not replayed",
    },
    timeout_s=60,
)
def forward_shape(ctx: ProbeContext):
    target = ctx.target
    model = target.fresh_model(ctx.seed).train()
    inputs, targets = target.batch()
    files = user_source_files(target)
    data = {"input_shape": list(inputs.shape) if hasattr(inputs, "shape") else None,
            "target_shape": list(targets.shape), "target_dtype": str(targets.dtype).replace("torch.", "")}
    with trace_modules(model) as trace:
        try:
            outputs = model(inputs)
            error = None
        except Exception as exc:  # the user's forward raising is what we measure
            error = exc
    rows = [[c.path, c.type, c.input, c.output if not c.raised else "raised"] for c in trace.calls]
    marked = [i for i, c in enumerate(trace.calls) if c.raised]
    layers = Table("layers", "Layer input and output shapes", ["module", "type", "input", "output"], rows, marked)
    if error is not None:
        bad = trace.failing
        data.update(error=first_line(error), kind=error_kind(error), where=user_frame(error, files), training_raised=True)
        if bad is not None:
            module = trace.modules.get(bad.path)
            expects = expected_input(module) if module is not None else None
            data.update(layer=bad.path, layer_type=bad.type, layer_input=bad.input, expects=expects)
            if data["kind"] == "shape":
                fits = f"; it expects {expects}" if expects else ""
                return failed("layer-shape", f"{bad.type} '{bad.path}' received input of shape {bad.input}{fits} "
                              f"({data['error']})", [layers], **data)
        where = f" in {bad.type} '{bad.path}'" if bad else ""
        return failed("forward-error", f"forward raised{where}: {data['error']}", [layers], **data)
    out_shape = list(outputs.shape) if isinstance(outputs, torch.Tensor) else None
    data["output_shape"] = out_shape
    try:
        loss = target.loss_fn(outputs, targets)
    except LossNotReplayable as exc:   # the forward is measured; the loss took a selection of it that is not replayed
        data["loss_not_replayed"] = str(exc)
        return passed(f"output {out_shape} from input {data['input_shape']}; the loss is not called again: {exc}",
                      "forward-only", artifacts=[layers], **data)
    except Exception as exc:
        kind = error_kind(exc)
        data.update(error=first_line(exc), kind=kind, where=user_frame(exc, files), training_raised=True)
        outcome = {"dtype": "loss-dtype", "label-range": "label-range", "shape": "loss-shape"}.get(kind, "loss-error")
        return failed(outcome, f"the loss raised on outputs {out_shape} / targets {data['target_shape']} "
                      f"({data['target_dtype']}): {data['error']}", [layers], **data)
    loss_shape = list(loss.shape) if isinstance(loss, torch.Tensor) else []
    data["loss_shape"] = loss_shape
    # what the loss receives: a script target's loss reshapes the output as the script did (script_target.ScriptLoss)
    adapt = getattr(target.loss_fn, "adapt", None)
    seen = adapt(outputs) if adapt is not None and isinstance(outputs, torch.Tensor) else outputs
    out_shape = list(seen.shape) if isinstance(seen, torch.Tensor) else out_shape
    if out_shape is not None and out_shape != data["target_shape"] and target.task in ("regression", "binary"):
        try:
            broadcast = list(torch.broadcast_shapes(tuple(out_shape), tuple(data["target_shape"])))
        except RuntimeError:
            broadcast = None
        if broadcast is not None and math.prod(broadcast) > max(math.prod(out_shape), math.prod(data["target_shape"])):
            data["broadcast_shape"] = broadcast
            return failed("broadcast", f"output {out_shape} and target {data['target_shape']} broadcast to "
                          f"{broadcast} inside the loss: every prediction is compared with every target", [layers], **data)
    return passed(f"output {out_shape} vs target {data['target_shape']} ({data['target_dtype']}); loss "
                  f"{float(loss.detach().float().mean()):.4g}", artifacts=[layers], **data)


@probe(
    "initial-loss",
    title="First-batch loss against the arithmetic expectation",
    outcomes={"ok": "the untrained loss is near its expected value", "high": "far above the expectation",
              "low": "far below the expectation", "non-finite": "the untrained loss is NaN/Inf",
              "no-reference": "no arithmetic expectation for this loss", "crashed": "forward or loss raised",
              "not-replayable": "the loss took a selection of the output that depends on the batch: not called again"},
    timeout_s=60,
)
def initial_loss(ctx: ProbeContext):
    target = ctx.target
    model = target.fresh_model(ctx.seed).eval()
    inputs, targets = target.batch()
    try:
        with torch.no_grad():
            outputs = model(inputs)
            loss = float(target.loss_fn(outputs, targets).float().mean())
    except LossNotReplayable as exc:
        return skipped(f"the untrained loss is not measured: {exc}", "not-replayable")
    except Exception as exc:
        return failed("crashed", f"forward or loss raised: {first_line(exc)}", error=first_line(exc))
    data = {"loss": loss}
    if isinstance(outputs, torch.Tensor) and outputs.is_floating_point():
        data["output_std"] = float(outputs.float().std()) if outputs.numel() > 1 else 0.0
        data["output_absmax"] = float(outputs.float().abs().max())
    if not math.isfinite(loss):
        return failed("non-finite", f"the untrained model's loss is already {loss}", **data)
    expected = target.expected_initial_loss(targets)
    if expected is None:
        return passed(f"initial loss {loss:.4g}; no arithmetic expectation for {type(target.loss_fn).__name__}", "no-reference", **data)
    value, how = expected
    ratio = loss / value if value > 0 else math.inf
    data.update(expected=value, expected_how=how, ratio=ratio)
    text = f"initial loss {loss:.4g} against {value:.4g} expected ({how}): {ratio:.2f}x"
    spread = f"; output std {data['output_std']:.3g}" if "output_std" in data else ""
    if ratio > 2.0 and loss - value > 0.5:
        return failed("high", text + spread, **data)
    if ratio < 0.4 and value - loss > 0.2:
        return failed("low", text, **data)
    return passed(text, **data)


def _true_loss(target, model, batch) -> float:
    return _as_stepped(target, model, batch)[0]


def _as_stepped(target, model, batch) -> tuple[float, float | None]:
    """loss_fn(model(x), y) and accuracy on the batch as the step computes them (train mode: BatchNorm normalises by
    the batch's own statistics) but without Dropout's noise, and without touching the running
    statistics: what a correct step drives down. (Eval mode would read BatchNorm running statistics
    that lag far behind the weights after a few dozen steps of a large network.)"""
    try:
        with steady_train_mode(model), torch.no_grad():
            outputs = model(batch[0])
            return float(target.loss_fn(outputs, batch[1]).float().mean()), target.accuracy(outputs, batch[1])
    except Exception:  # the step's own crash is reported by the caller
        return math.nan, None


def _clear(target, model, batch, losses: list[float], every: int = CHECK_EVERY) -> bool:
    """Whether a run the budget may cut already has a clear outcome (checked every ``every`` steps):
    its loss below ``CLEAR_DROP`` of the start, or the batch memorised. Neither depends on how many
    steps it took, so the check does not wait for the planned minimum."""
    if len(losses) % every:
        return False
    if losses[-1] < CLEAR_DROP * losses[0]:
        return True
    return overfit_outcome(losses, _as_stepped(target, model, batch)[1]) == "learns"


@probe(
    "overfit-one-batch",
    title="Overfit one small batch through the user's optimizer and step",
    outcomes={"learns": "loss approaches zero and accuracy reaches 100%",
              "slow": "loss falls but stays far from zero", "stuck": "loss does not fall",
              "unchanged": "loss and parameters do not change at all",
              "diverged": "loss becomes NaN/Inf", "crashed": "the step raised",
              "target-mismatch": "the step's loss approaches zero while the loss against the targets does not"},
    timeout_s=120,
    share=0.2,
    floor=MIN_OVERFIT_STEPS + 3,
)
def overfit_one_batch(ctx: ProbeContext):
    target = ctx.target
    size, wanted = int(ctx.param("samples", 16)), int(ctx.param("steps", 200))
    steps = ctx.plan_steps(wanted, minimum=MIN_OVERFIT_STEPS, fixed=3)
    if not steps:
        return ctx.unaffordable(MIN_OVERFIT_STEPS, "steps overfitting one batch needs", wanted=wanted)
    if steps < wanted:
        # the budget cuts the run: fewer samples are memorised in fewer steps (a cut run concludes only
        # "learns", never "slow"; the summary names the samples it memorised)
        size = min(size, SMALL_SLICE)
    batch = target.batch(size=size)
    model = target.fresh_model(ctx.seed)
    optimizer = target.make_optimizer(model)
    before = [p.detach().clone() for p in model.parameters()]
    true_start = _true_loss(target, model, batch)
    losses: list[float] = []
    files = user_source_files(target)
    started, early = time.monotonic(), False
    try:
        # past the planned steps while the probe's own steps fit (a cut run cannot conclude: it may borrow)
        while ctx.more_steps(len(losses), steps, wanted, borrow=True):
            losses.append(target.train_step(model, batch, optimizer))
            step = len(losses)
            if not math.isfinite(losses[-1]) or losses[-1] < 1e-4:
                early = True
                break
            if ctx.time_left() < 1:
                break
            if steps < wanted and _clear(target, model, batch, losses):  # no need for the rest
                early = True
                break
            if step % 20 == 0:
                ctx.progress(step / wanted, f"step {step} loss {losses[-1]:.4g}")
    except Exception as exc:
        data = dict(error=first_line(exc), kind=error_kind(exc), where=user_frame(exc, files), step=len(losses),
                    training_raised=True)
        data["hypothesis"] = classify_exception(exc, model=model, loss_fn=target.loss_fn, files=files, targets=batch[1]).hypothesis
        if data["kind"] == "inplace":  # name the forward op whose saved output was overwritten
            replay = target.fresh_model(ctx.seed)
            data["origin"] = anomaly_origin(lambda: target.train_step(replay, batch, target.make_optimizer(replay)), files) or "?"
        return failed("crashed", f"the training step raised at step {len(losses)}: {data['error']}"
                      + (f" ({data['where']})" if data["where"] else "")
                      + (f"; autograd saved the result of {data['origin']}" if data.get("origin") else ""), **data)
    moved = max((float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before)), default=0.0)
    true_end, accuracy = _as_stepped(target, model, batch)
    first, last = losses[0], losses[-1]
    best = min((l for l in losses if math.isfinite(l)), default=math.nan)
    fn = "train_step" if target.user_train_step else "the reference step"
    data = dict(samples=len(batch[1]), steps=len(losses), planned_steps=steps, wanted_steps=wanted, first_loss=first, final_loss=last, best_loss=best,
                ratio=(last / first) if first else math.nan, accuracy=accuracy, max_param_change=moved,
                step_fn=fn, seconds=round(time.monotonic() - started, 2), true_start=true_start, true_end=true_end)
    plot = LinePlot("curve", f"Overfitting {len(batch[1])} samples ({fn})", {"loss": losses}, logy=all(l > 0 for l in losses if math.isfinite(l)))
    acc = f", accuracy {accuracy:.0%}" if accuracy is not None else ""
    cut = len(losses) < wanted and not early
    ran = f"{len(losses)} steps" if not cut else f"{len(losses)} steps (of {wanted} wanted; the budget fit {len(losses)})"
    if early and len(losses) < wanted:
        ran += f" (stopped at a clear outcome, of {wanted} wanted)"
    text = f"{len(batch[1])} samples, {ran} of {fn}: loss {first:.4g} -> {last:.4g}{acc}"
    outcome = overfit_outcome(losses, accuracy, moved)
    if outcome == "diverged":
        bad = next(i for i, l in enumerate(losses) if not math.isfinite(l))
        data["nan_step"] = bad
        return failed("diverged", f"{text}: non-finite at step {bad}", [plot], **data)
    if outcome == "unchanged":
        return failed("unchanged", f"{text}: no parameter changed (max |delta| = 0) over {len(losses)} steps", [plot], **data)
    # The loss the step returns fell by 90% while the loss of the same model against the batch's own
    # targets did not even halve: the step minimises something other than loss_fn(outputs, targets).
    if last < 0.1 * first and math.isfinite(true_start) and true_end > 0.5 * true_start:
        return failed("target-mismatch", f"{text}, but loss_fn(model(x), y) on the same batch went {true_start:.4g} -> "
                      f"{true_end:.4g}: the step minimises a different loss", [plot], **data)
    if outcome == "learns":
        return passed(text, "learns", [plot], **data)
    if cut and len(losses) < wanted and math.isfinite(last):
        # fewer steps than the test is calibrated for: "slow" or "stuck" would be a wrong verdict
        return cannot_run(f"{text}: not learnt within the {len(losses)} steps the budget fit, too few to call it slow "
                       f"or stuck (--budget to give it more)", **data, reason="budget")
    return failed(outcome, text, [plot], **data)


def overfit_outcome(losses: list[float], accuracy: float | None = None, moved: float | None = None) -> str:
    """What a run over one repeated batch shows, from its per-step losses: ``diverged`` (non-finite at
    the end), ``unchanged`` (no parameter and no loss moved), ``learns`` (the loss fell to near zero or
    by 90%, with full accuracy where measured; or, where accuracy is measured, every sample right with
the loss below ``MEMORISED`` of its start), ``slow`` (fell by 30% or more) or ``stuck``. One rule for
    the module probe and the script rerun (probes/intervene.py)."""
    first, last = losses[0], losses[-1]
    if not math.isfinite(last):
        return "diverged"
    if moved == 0.0 and (max(losses) - min(losses)) <= 1e-6 * max(abs(first), 1e-12):
        return "unchanged"
    if (last < 0.05 or last < 0.1 * first) and (accuracy is None or accuracy >= 0.99):
        return "learns"
    if accuracy is not None and accuracy >= 0.99 and last < MEMORISED * first:
        return "learns"  # every sample right by the task's own decision rule, the loss down by two thirds
    return "slow" if last < 0.7 * first else "stuck"
