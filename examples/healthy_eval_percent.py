"""Healthy: a classifier whose own evaluate reports accuracy in percent and divides the summed loss by
len(loader.dataset); a lambda loss around F.cross_entropy (the task is read from the call)."""

import torch
import torch.nn.functional as F
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = lambda logits, y: F.cross_entropy(logits, y)  # noqa: E731


@torch.no_grad()
def evaluate(model, loader, loss_fn):
    model.eval()
    total, correct = 0.0, 0
    for x, y in loader:
        out = model(x)
        total += loss_fn(out, y).item() * len(y)
        correct += (out.argmax(1) == y).sum().item()
    n = len(loader.dataset)
    return {"loss": total / n, "accuracy_pct": 100.0 * correct / n}
