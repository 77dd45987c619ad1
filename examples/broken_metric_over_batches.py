"""Broken: evaluate adds up the correct predictions of every batch but divides by the number of
batches instead of the number of samples, so "accuracy" comes out around 20 (well above 1)."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["metric-wrong"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


@torch.no_grad()
def evaluate(model, loader, loss_fn):
    model.eval()
    correct, loss = 0, 0.0
    for x, y in loader:
        out = model(x)
        loss += loss_fn(out, y).item() * len(y)
        correct += (out.argmax(1) == y).sum().item()
    return {"loss": loss / len(loader.dataset), "accuracy": correct / len(loader)}   # meant: len(loader.dataset)
