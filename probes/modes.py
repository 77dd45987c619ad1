"""Train/eval mode across the user's loop: train, evaluate, then train again, recording the
``training`` flag of every Dropout and BatchNorm layer each time it runs. A user ``evaluate`` that
calls ``model.eval()`` while nothing in the training function calls ``model.train()`` leaves those
layers in eval mode for every epoch after the first: dropout silently off, BatchNorm frozen."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd

from nnwizard.record.frames import first_line, user_frame
from nnwizard.probes.api import ProbeContext, Table, cannot_run, failed, passed, probe, skipped
from nnwizard.target import user_source_files

MODE_TYPES = (_DropoutNd, nn.AlphaDropout, nn.FeatureAlphaDropout, _BatchNorm)


@contextmanager
def steady_train_mode(model: nn.Module):
    """``model`` in train mode with its Dropout layers off: a step's forward as it computes its loss (BatchNorm
    normalises by the batch's own statistics) without Dropout's noise; its buffers (running statistics) and its
    mode are restored afterwards, so the model is as it was."""
    was = model.training
    buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
    model.train()
    for m in model.modules():
        if isinstance(m, _DropoutNd):
            m.eval()
    try:
        yield model
    finally:
        with torch.no_grad():
            for k, v in model.named_buffers():
                if k in buffers:
                    v.copy_(buffers[k])
        model.train(was)


def _mode_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Layers whose forward depends on ``training`` (skipping p=0 dropout, which does nothing)."""
    layers = {}
    for path, m in model.named_modules():
        if isinstance(m, MODE_TYPES) and not (isinstance(m, _DropoutNd) and getattr(m, "p", 1) == 0):
            layers[path or "(model)"] = m
    return layers


@probe(
    "mode-after-eval",
    title="Train, evaluate, train again: are Dropout/BatchNorm back in training mode?",
    outcomes={
        "ok": "the second training pass runs with Dropout/BatchNorm in training mode",
        "stays-eval": "after evaluate, the next training pass runs with Dropout/BatchNorm in eval mode",
        "eval-in-training": "even the first training pass runs with Dropout/BatchNorm in eval mode",
        "no-mode-layers": "the model has no Dropout or BatchNorm module, so train/eval mode changes only code that reads self.training",
    },
    timeout_s=60,
    cost=6,
)
def mode_after_eval(ctx: ProbeContext):
    target = ctx.target
    if not (target.user_evaluate or target.user_train_epoch or target.user_train_step):
        return skipped("no user train_step, train_epoch or evaluate: the reference loop sets the modes itself")
    model = target.fresh_model(ctx.seed)
    layers = _mode_layers(model)
    if not layers:
        return passed(f"{type(model).__name__} has no Dropout or BatchNorm module: eval mode changes only code that reads self.training",
                      "no-mode-layers")
    batches = int(ctx.param("batches", 1 if target.sample_limit else 2))  # 1 when the session slices dear batches
    optimizer = target.make_optimizer(model)
    scheduler = target.make_scheduler(optimizer)
    phase = {"name": "setup"}
    seen: dict[str, dict[str, list[bool]]] = {"train-1": {}, "evaluate": {}, "train-2": {}}

    def hook(module, args, _path=None):
        flags = seen.setdefault(phase["name"], {})
        flags.setdefault(_path, []).append(module.training)

    handles = [m.register_forward_pre_hook(lambda mod, args, _p=p: hook(mod, args, _p)) for p, m in layers.items()]
    train_fn = "train_epoch" if target.user_train_epoch else "train_step" if target.user_train_step else "reference step"
    eval_fn = "evaluate" if target.user_evaluate else "the reference evaluate"
    files = user_source_files(target)
    state = {}
    try:
        for name in ("train-1", "evaluate", "train-2"):
            phase["name"] = name
            if name == "evaluate":
                target.evaluate(model, target.subset_loader("val", batches) or target.subset_loader("train", batches))
                state["after_eval"] = model.training
                state["layers_after_eval"] = sum(m.training for m in layers.values())
            else:
                target.train_epoch(model, target.loader("train", batches), optimizer, scheduler)
    except Exception as exc:  # the user's loop raising is another probe's finding
        return cannot_run(f"the {phase['name']} pass raised: {first_line(exc)} ({user_frame(exc, files)})",
                          reason="raised", error=first_line(exc))
    finally:
        for h in handles:
            h.remove()

    def eval_layers(name: str) -> list[str]:
        return [p for p, flags in seen[name].items() if flags and not all(flags)]

    first, second = eval_layers("train-1"), eval_layers("train-2")
    ran = [p for p in layers if seen["train-2"].get(p)]
    rows = [[p, type(m).__name__, _fmt(seen["train-1"].get(p)), _fmt(seen["evaluate"].get(p)), _fmt(seen["train-2"].get(p))]
            for p, m in layers.items()]
    table = Table("modes", "training flag of each Dropout/BatchNorm layer per pass",
                  ["layer", "type", f"1st {train_fn}", eval_fn, f"2nd {train_fn}"], rows,
                  marked=[i for i, r in enumerate(rows) if r[0] in second])
    kinds = sorted({type(layers[p]).__name__ for p in second or first})
    data = dict(train_fn=train_fn, eval_fn=eval_fn, layers=len(layers), ran=len(ran), eval_layers=len(second),
                first_eval_layers=len(first), layer_names=", ".join(f"'{p}' ({type(layers[p]).__name__})" for p in (second or first)[:6]), layer_types=", ".join(kinds),
                model_training_after_eval=state.get("after_eval"), batches=batches)
    if first:
        return failed("eval-in-training", f"already during the first {train_fn} pass {len(first)} of {len(layers)} layers "
                      f"ran with training=False ({data['layer_names']})", [table], **data)
    if second:
        return failed("stays-eval", f"after {eval_fn}, {len(second)} of {len(ran)} {'/'.join(kinds)} layers ran the next "
                      f"{train_fn} pass with training=False ({data['layer_names']}): {train_fn} never calls "
                      f"model.train() and {eval_fn} leaves the model in eval mode", [table], **data)
    if not ran:
        return skipped(f"no Dropout/BatchNorm layer ran during the second {train_fn} pass", **data)
    return passed(f"train -> {eval_fn} -> train: all {len(ran)} Dropout/BatchNorm layers were in training mode during "
                  f"the second {train_fn} pass", artifacts=[table], **data)


def _fmt(flags: list[bool] | None) -> str:
    if not flags:
        return "-"
    if all(flags):
        return "train"
    if not any(flags):
        return "eval"
    return f"mixed ({sum(flags)}/{len(flags)} train)"
