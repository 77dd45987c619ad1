"""The wizard's own, correct training loop: used where the user gives none, and as the reference
that the loop audits compare the user's functions against."""

from __future__ import annotations

import math

import torch


def as_float(loss) -> float:
    if loss is None:
        return math.nan
    if isinstance(loss, torch.Tensor):
        return float(loss.detach().float().mean().item())
    return float(loss)


class NoScheduler:
    """Stands in where the user's train_epoch expects a scheduler and the probe wants a constant LR
    (or the module builds none): its step() does nothing."""

    def step(self, *args, **kwargs):
        return None

    def get_last_lr(self):
        return []


def train_step(model, batch, loss_fn, optimizer) -> float:
    model.train()
    inputs, targets = batch
    optimizer.zero_grad(set_to_none=True)
    loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.item()


def train_epoch(model, loader, loss_fn, optimizer, scheduler=None) -> float:
    losses = [train_step(model, batch, loss_fn, optimizer) for batch in loader]
    if scheduler is not None:
        scheduler.step()
    return sum(losses) / max(len(losses), 1)


def accuracy(outputs: torch.Tensor, targets: torch.Tensor, task: str) -> float | None:
    """Share of correct predictions, or None for regression / shapes this cannot read."""
    if task == "classification" and outputs.dim() >= 2 and targets.dtype in (torch.long, torch.int):
        return (outputs.argmax(1) == targets).float().mean().item()
    if task == "binary":
        logits = outputs.reshape(-1)
        truth = targets.reshape(-1)
        if logits.shape != truth.shape:
            return None
        threshold = 0.5 if bool(((logits >= 0) & (logits <= 1)).all()) else 0.0
        return ((logits > threshold).float() == (truth > 0.5).float()).float().mean().item()
    return None


@torch.no_grad()
def evaluate(model, loader, loss_fn, task: str = "classification") -> dict[str, float]:
    was_training = model.training
    model.eval()
    total, correct, count, seen = 0.0, 0.0, 0, 0
    for inputs, targets in loader:
        outputs = model(inputs)
        total += as_float(loss_fn(outputs, targets)) * len(targets)
        acc = accuracy(outputs, targets, task)
        if acc is not None:
            correct += acc * len(targets)
        count += len(targets)
        seen += 1
    model.train(was_training)
    metrics = {"loss": total / max(count, 1)}
    if task != "regression" and count:
        metrics["accuracy"] = correct / count
    return metrics
