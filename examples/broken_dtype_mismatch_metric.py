"""Broken: training is fine, but evaluate averages a Long tensor ((pred == y).long().mean()), which
torch refuses: every validation pass raises (crash)."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["dtype-mismatch"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


@torch.no_grad()
def evaluate(model, loader, loss_fn):
    model.eval()
    losses, accs = [], []
    for x, y in loader:
        out = model(x)
        losses.append(loss_fn(out, y).item())
        accs.append((out.argmax(1) == y).long().mean().item())     # mean() of int64 raises
    return {"loss": sum(losses) / len(losses), "accuracy": sum(accs) / len(accs)}
