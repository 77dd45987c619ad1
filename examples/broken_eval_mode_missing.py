"""Broken: evaluate() never calls model.eval(): Dropout keeps dropping and BatchNorm keeps updating
its running statistics on validation batches."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["eval-mode-missing"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.5), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def evaluate(model, loader, loss_fn):
    total, correct, n = 0.0, 0, 0
    with torch.no_grad():             # model.eval() is missing
        for x, y in loader:
            out = model(x)
            total += loss_fn(out, y).item() * len(y)
            correct += (out.argmax(1) == y).sum().item()
            n += len(y)
    return {"loss": total / n, "accuracy": correct / n}
