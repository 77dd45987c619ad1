"""Audits of the user's own ``evaluate``: does it switch Dropout/BatchNorm to eval mode, and does it
run without building an autograd graph? Both run the user's function on a fresh model left in
training mode (as it is after a training epoch), over a few validation batches."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from nnwizard import reference
from nnwizard.record.frames import first_line
from nnwizard.record.tracers import Reductions
from nnwizard.probes._metrics import judge
from nnwizard.probes.api import ProbeContext, cannot_run, failed, passed, probe, skipped

BATCHES = 3
MAX_BATCHES = 64  # metric-audit reads the whole validation set up to this many batches ...
SLICED_BATCHES = 2  # ... or this many when the session slices dear batches (still tells samples from batches)
MODE_LAYERS = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)


def _val_loader(target, batches: int | None = BATCHES):
    """A real DataLoader over the first validation batches (training when there is no validation set)
    whose dataset is exactly what it iterates."""
    return target.subset_loader("val", batches) or target.subset_loader("train", batches)


def _bn_stats(model: nn.Module) -> list[torch.Tensor]:
    return [b.detach().clone() for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
            for b in (m.running_mean, m.running_var) if b is not None]


@probe(
    "eval-mode-audit",
    title="Dropout and BatchNorm modes while the user's evaluate runs",
    outcomes={"ok": "every Dropout/BatchNorm ran in eval mode and BatchNorm statistics did not change",
              "train-mode": "Dropout/BatchNorm ran in training mode during evaluate",
              "no-mode-layers": "the model has no Dropout or BatchNorm, so its mode does not change its outputs"},
    timeout_s=60,
    cost=3,
)
def eval_mode_audit(ctx: ProbeContext):
    target = ctx.target
    if not target.user_evaluate:
        return skipped("no user evaluate: the wizard's reference evaluation switches to eval mode itself")
    model = target.fresh_model(ctx.seed).train()
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, MODE_LAYERS)]
    if not layers:
        return passed(f"{type(model).__name__} has no Dropout or BatchNorm layers", "no-mode-layers")
    seen: dict[str, list[bool]] = {}
    handles = [m.register_forward_pre_hook(lambda mod, args, _n=n: seen.setdefault(_n, []).append(mod.training))
               for n, m in layers]
    twin = copy.deepcopy(model)
    stats = _bn_stats(model)
    try:
        metrics = target.evaluate(model, _val_loader(target))
    except Exception as exc:
        return cannot_run(f"evaluate raised: {first_line(exc)}", reason="raised", error=first_line(exc))
    finally:
        for h in handles:
            h.remove()
    drift = max((float((a - b).abs().max()) for a, b in zip(_bn_stats(model), stats)), default=0.0)
    training = sorted(n for n, flags in seen.items() if any(flags))
    kinds = sorted({type(m).__name__ for n, m in layers if n in training})
    forwards = max((len(v) for v in seen.values()), default=0)
    data: dict[str, Any] = dict(layers=len(layers), forwards=forwards, training_layers=len(training),
                                training_names=", ".join(training[:6]), kinds=", ".join(kinds), bn_drift=drift,
                                left_training=model.training)
    user_loss = metrics.get("loss") if isinstance(metrics, dict) else None
    try:
        reference_metrics = reference.evaluate(twin, _val_loader(target), target.loss_fn, target.task)
        data["eval_loss"] = reference_metrics["loss"]
    except Exception:
        reference_metrics = None
    if user_loss is not None:
        data["user_loss"] = user_loss
    compare = (f"; it reports loss {user_loss:.4g} where the same model in eval mode scores {data['eval_loss']:.4g}"
               if user_loss is not None and "eval_loss" in data else "")
    if training or drift > 0:
        moved = f"; BatchNorm running statistics moved by up to {drift:.3g}" if drift > 0 else ""
        return failed("train-mode", f"evaluate ran {forwards} forward passes with {len(training)} of {len(layers)} "
                      f"Dropout/BatchNorm layers in training mode ({data['kinds']}: {data['training_names']}){moved}"
                      f"{compare}", **data)
    return passed(f"evaluate ran {forwards} forward passes with all {len(layers)} Dropout/BatchNorm layers in eval mode",
                  **data)


@probe(
    "no-grad-audit",
    title="Grad mode and autograd memory while the user's evaluate runs",
    outcomes={"ok": "evaluate runs under no_grad / inference_mode", "graph-built": "evaluate records an autograd graph"},
    timeout_s=60,
    cost=3,
)
def no_grad_audit(ctx: ProbeContext):
    target = ctx.target
    if not target.user_evaluate:
        return skipped("no user evaluate: the wizard's reference evaluation runs under torch.no_grad()")
    model = target.fresh_model(ctx.seed).train()
    if not any(p.requires_grad for p in model.parameters()):
        return skipped("no parameter requires grad, so no graph can be recorded")
    calls: list[tuple[bool, bool, str]] = []

    def hook(mod, args, output):
        out = output[0] if isinstance(output, (tuple, list)) and output else output
        grad_fn = type(out.grad_fn).__name__ if isinstance(out, torch.Tensor) and out.grad_fn is not None else ""
        calls.append((torch.is_grad_enabled(), isinstance(out, torch.Tensor) and out.requires_grad, grad_fn))

    saved = {"bytes": 0, "tensors": 0}

    def pack(t: torch.Tensor):
        saved["bytes"] += t.numel() * t.element_size()
        saved["tensors"] += 1
        return t

    handle = model.register_forward_hook(hook)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            target.evaluate(model, _val_loader(target))
    except Exception as exc:
        return cannot_run(f"evaluate raised: {first_line(exc)}", reason="raised", error=first_line(exc))
    finally:
        handle.remove()
    if not calls:
        return cannot_run("evaluate never called the model's forward", reason="precondition")
    enabled = sum(c[0] for c in calls)
    graphs = sum(c[1] for c in calls)
    grad_fn = next((c[2] for c in calls if c[2]), "")
    per_batch = saved["bytes"] / len(calls)
    data = dict(forwards=len(calls), grad_enabled=enabled, outputs_with_graph=graphs, grad_fn=grad_fn or "none",
                saved_bytes=saved["bytes"], saved_tensors=saved["tensors"], saved_mb_per_batch=per_batch / 2**20)
    if graphs:
        return failed("graph-built", f"evaluate ran {len(calls)} forward passes with grad enabled in {enabled}; outputs "
                      f"carried a graph ({grad_fn}) and autograd saved {saved['tensors']} tensors "
                      f"({per_batch / 2**20:.3g} MB per batch) for a backward that never comes", **data)
    return passed(f"evaluate ran {len(calls)} forward passes without recording a graph", **data)


# ----------------------------------------------------------------------------------- metric-audit
def _accuracy_keys(metrics: dict) -> list[str]:
    return [k for k in metrics if "acc" in k.lower()]


def _reference_counts(model, loader, target, max_batches: int | None = None) -> dict[str, float]:
    """Correct predictions, samples, batches and the per-sample mean loss, computed by the wizard on
    exactly the batches the user's evaluate reads (the first ``max_batches`` when it stops early)."""
    was = model.training
    model.eval()
    correct = samples = batches = 0
    loss_sum = 0.0
    scored = True
    with torch.no_grad():
        for x, y in loader:
            if max_batches is not None and batches >= max_batches:
                break
            out = model(x)
            acc = target.accuracy(out, y) if isinstance(out, torch.Tensor) else None
            if acc is None:
                scored = False
            else:
                correct += acc * len(y)
            loss_sum += reference.as_float(target.loss_fn(out, y)) * len(y)
            samples += len(y)
            batches += 1
    model.train(was)
    return dict(correct=round(correct) if scored else None, samples=samples, batches=batches,
                accuracy=correct / samples if scored and samples else None, loss=loss_sum / max(samples, 1))


@probe(
    "metric-audit",
    title="What the user's evaluate reports, against the same metrics computed on the same batches",
    outcomes={"ok": "the reported metrics agree with the wizard's on the same batches",
              "percent": "accuracy is reported in percent (consistent with the wizard's on that scale)",
              "above-one": "an accuracy above 1 that is no percentage",
              "argmax-single": "accuracy from an argmax over a dimension of size 1: fixed at one class",
              "not-reset": "the same model evaluated twice reports different numbers: a running total is never reset",
              "wrong-count": "an accuracy or loss divided by the wrong count",
              "fixed": "the accuracy stays the same for models that predict differently"},
    timeout_s=60,
)
def metric_audit(ctx: ProbeContext):
    target = ctx.target
    if not target.user_evaluate:
        return skipped("no user evaluate: the wizard's reference evaluation computes its own metrics")
    full = _val_loader(target, None)
    most = SLICED_BATCHES if target.sample_limit else MAX_BATCHES  # five passes over what it reads
    if full is not None and len(full) > most:
        full = _val_loader(target, most)
    model = target.fresh_model(ctx.seed).eval()  # eval mode: two calls on one model must agree
    other = target.fresh_model(ctx.seed + 1).eval()
    modes: list[bool] = []  # one entry per forward call of the first evaluate
    hook = model.register_forward_pre_hook(lambda m, a: modes.append(m.training))
    tracer = Reductions()
    try:
        with tracer:
            first = target.evaluate(model, full)
        hook.remove()
        second = target.evaluate(model, full)
        third = target.evaluate(other, full)
    except Exception as exc:
        return cannot_run(f"evaluate raised: {first_line(exc)}", reason="raised", error=first_line(exc))
    finally:
        hook.remove()
    if any(modes) and any(isinstance(m, MODE_LAYERS) for m in model.modules()):
        return cannot_run("evaluate switches the model to training mode (Dropout/BatchNorm), so its numbers are random "
                          "draws that cannot be compared (see eval-mode-audit)", reason="precondition")
    seen = len(modes) if 0 < len(modes) < len(full) else None  # evaluate stopped early: compare on what it read
    ref, ref_other = _reference_counts(model, full, target, seen), _reference_counts(other, full, target, seen)
    counts = {"samples": ref["samples"], "batches": ref["batches"],
              "dataset": len(getattr(full, "dataset", [])) if hasattr(getattr(full, "dataset", None), "__len__") else 0,
              "batch size": getattr(full, "batch_size", 0) or 0}
    keys = _accuracy_keys(first)
    data: dict[str, Any] = dict(reported=first, reported_again=second, reported_other_model=third, samples=ref["samples"],
                                batches=ref["batches"], reference_accuracy=ref["accuracy"], reference_loss=ref["loss"],
                                accuracy_keys=keys, percent=False)
    on = f"{ref['samples']} samples in {ref['batches']} batches" + (f" (evaluate read only the first {seen} of {len(full)} batches)" if seen else "")
    data["batches_read"] = len(modes)
    changed = {k: (first[k], second[k]) for k in first if k in second and abs(first[k] - second[k]) > 1e-6 * max(1.0, abs(first[k]))}
    if changed:
        k, (a, b) = next(iter(changed.items()))
        ratio = b / a if a else math.inf
        data.update(key=k, first=a, second=b, ratio=ratio)
        return failed("not-reset", f"evaluate reported {k} = {a:.4g}, then {b:.4g} for the same model on the same "
                      f"{on} (x{ratio:.2f}): a running total kept between calls is never reset", **data)
    if tracer.single and keys:
        name, shape = tracer.single[0]
        value = first[keys[0]]
        data.update(key=keys[0], first=value, op=name, op_shape=shape)
        return failed("argmax-single", f"evaluate takes {name} over a dimension of size 1 (input {shape}): every "
                      f"prediction is class 0, so {keys[0]} = {value:.4g} is the share of class-0 targets whatever the "
                      f"model learns", **data)
    for k in keys:
        value = first[k]
        if ref["correct"] is None:
            continue
        verdict = judge(k, value, ref["correct"], counts, on)   # (probes/_metrics.py: script mode's rules too)
        data.update(verdict.data)
        if verdict.outcome == "percent":
            return passed(f"evaluate reports {verdict.text}", "percent", **data)
        if verdict.outcome is not None:
            return failed(verdict.outcome, f"evaluate reports {verdict.text}", **data)
        if (third.get(k) == value and ref_other["accuracy"] is not None
                and abs(ref_other["accuracy"] - ref["accuracy"]) * ref["samples"] >= 3):
            data.update(key=k, first=value, other_reference=ref_other["accuracy"])
            return failed("fixed", f"evaluate reports {k} = {value:.4g} for two models whose predictions score "
                          f"{ref['accuracy']:.4f} and {ref_other['accuracy']:.4f} on the same {on}", **data)
    loss = first.get("loss")
    if loss is not None and math.isfinite(loss) and ref["loss"] > 0 and target.user_evaluate:
        ratio = loss / ref["loss"]
        data["loss_ratio"] = round(ratio, 4)
        for what, d in counts.items():
            if d > 1 and abs(ratio - d) <= 0.02 * d:
                data.update(key="loss", first=loss)
                return failed("wrong-count", f"evaluate reports loss {loss:.4g} = {ratio:.2f}x the per-sample mean "
                              f"{ref['loss']:.4g} on {on}: a sum over the {what} ({d}) where a mean was meant", **data)
    shown = ", ".join(f"{k} {first[k]:.4g}" for k in list(first)[:3])
    ref_text = f"; the wizard's accuracy {ref['accuracy']:.4f}" if ref["accuracy"] is not None else ""
    return passed(f"evaluate on {on} reports {shown}{ref_text}; the same on a second call", **data)
