"""Broken: a regression model with one output is "scored" with argmax over its single output
column, so every prediction is class 0 and the accuracy is fixed, whatever the model learns."""

import torch
from torch import nn

from examples.datasets import regression, split

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["metric-wrong"]}


def build_model():
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def build_data():
    return split(*regression())


loss_fn = nn.MSELoss()


@torch.no_grad()
def evaluate(model, loader, loss_fn):
    model.eval()
    loss, hits, n = 0.0, 0, 0
    for x, y in loader:
        out = model(x)
        loss += loss_fn(out, y).item() * len(y)
        hits += (out.argmax(dim=1) == (y[:, 0] > 0).long()).sum().item()   # copied from a classifier
        n += len(y)
    return {"loss": loss / n, "accuracy": hits / n}
