"""Broken: evaluate keeps its counters at module level and never resets them, so every call adds to
the previous ones: the reported accuracy drifts with the number of evaluations, not with the model."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["metric-wrong"]}
STATS = {"correct": 0, "seen": 0, "loss": 0.0, "calls": 0}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


@torch.no_grad()
def evaluate(model, loader, loss_fn):
    model.eval()
    STATS["calls"] += 1
    for x, y in loader:
        out = model(x)
        STATS["loss"] += loss_fn(out, y).item()
        STATS["correct"] += (out.argmax(1) == y).sum().item()
    STATS["seen"] += len(loader.dataset) // STATS["calls"]      # "average over the calls so far"
    return {"loss": STATS["loss"] / len(loader), "accuracy": STATS["correct"] / max(STATS["seen"], 1)}
