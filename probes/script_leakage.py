"""``script-leakage``: module mode's ``leakage-audit`` on what a script trains and evaluates on.

A script has no ``build_data()``; its two sides are read where it has them:

- the datasets of its DataLoaders, when it builds them: the loader whose passes ran backwards (training)
  and one iterated without any (evaluation), read by index as module mode reads its loaders;
- otherwise the captured batches: the inputs its model received at its first training forwards (the
  recording keeps them) against the inputs of its first evaluation pass (the rerun that script-metric-audit
  makes, made here when it did not run).

Exact and near duplicates (augmented copies: noise, flips, one-pixel shifts) between the two are then
judged by ``leakage-audit`` itself, which also names data augmented before the split.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch
from torch.utils.data import DataLoader, TensorDataset

from nnwizard.probes.api import ProbeContext, passed, probe, skipped
from nnwizard.probes.intervene import on_script
from nnwizard.probes.leakage import leakage_audit
from nnwizard.script_target import main_model


def _loaders(rec):
    """(training DataLoader, evaluation DataLoader) the script iterated, or Nones."""
    train = next((i.loader for i in rec.loaders if any(b > 0 for b in i.backwards)), None)
    held = next((i.loader for i in rec.loaders if i.iterations and not any(i.backwards) and i.loader is not train
                 and getattr(i.loader, "dataset", None) is not getattr(train, "dataset", None)), None)
    return train, held


def _stack(parts: list) -> torch.Tensor | None:
    parts = [p for p in parts if isinstance(p, torch.Tensor) and p.dim()]
    if not parts or len({tuple(p.shape[1:]) for p in parts}) != 1:
        return None
    return torch.cat(parts)


@probe(
    "script-leakage",
    title="Training and evaluation samples of the script that are the same sample (exact and augmented copies)",
    outcomes={"ok": "no more overlap than training samples have among themselves",
              "leak": "evaluation samples duplicate training samples far more often than training samples repeat",
              "no-val": "the script evaluates on nothing separate from its training data"},
    timeout_s=90,
    cost=3,
)
@on_script
def script_leakage(ctx: ProbeContext, target):
    from nnwizard.probes.script_metrics import evaluation_capture

    rec = target.recording
    train, held = _loaders(rec)
    how = "the datasets of its training and evaluation DataLoaders"
    if train is None or held is None:
        info = main_model(rec)
        train_x = _stack([a[0] for i, a in rec.model_inputs if info is not None and i == info.index and a])
        evaluates = any(not f.trained and (f.grad_enabled is False or f.training is False) for f in rec.forwards)
        if train_x is None or not evaluates:
            return skipped("the script ran no evaluation on inputs separate from its training batches", "no-val")
        tap, _ = evaluation_capture(ctx, target)
        val_x = _stack(tap.inputs)
        if val_x is None or val_x.shape[1:] != train_x.shape[1:]:
            return skipped("the evaluation's inputs could not be read as one tensor of the training inputs' shape", "no-val")
        zeros = lambda x: torch.zeros(len(x), dtype=torch.long)  # noqa: E731 - labels are not compared
        train = DataLoader(TensorDataset(train_x, zeros(train_x)), batch_size=256)
        held = DataLoader(TensorDataset(val_x, zeros(val_x)), batch_size=256)
        how = (f"the inputs of its first {len(rec.model_inputs)} training forwards ({len(train_x)} samples) and of its "
               f"first evaluation pass ({len(val_x)} samples)")
    adapter = SimpleNamespace(train_loader=train, val_loader=held, device=torch.device("cpu"), sample_limit=None)
    result = leakage_audit(dataclasses.replace(ctx, target=adapter))
    if result.status in ("passed", "failed"):
        result.summary = f"on {how}: {result.summary}"
        result.data["read_from"] = how
    elif result.outcome == "skipped" and not result.summary:
        return passed("nothing to compare", "no-val")
    return result
