"""Audits of the user's own ``evaluate``: does it switch Dropout/BatchNorm to eval mode, and does it
run without building an autograd graph? Both run the user's function on a fresh model left in
training mode (as it is after a training epoch), over a few validation batches."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from nnwizard import reference
from nnwizard.probes._instrument import first_line
from nnwizard.probes.api import ProbeContext, failed, passed, probe, skipped

BATCHES = 3
MODE_LAYERS = (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._BatchNorm)


def _val_loader(target):
    return target.loader("val", BATCHES) or target.loader("train", BATCHES)


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
        return skipped(f"evaluate raised: {first_line(exc)}", error=first_line(exc))
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
        return skipped(f"evaluate raised: {first_line(exc)}", error=first_line(exc))
    finally:
        handle.remove()
    if not calls:
        return skipped("evaluate never called the model's forward")
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
