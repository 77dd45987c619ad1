"""Broken: evaluate() switches the model to eval mode and nothing switches it back; train_epoch
never calls model.train(), so from the second epoch on Dropout is off and BatchNorm frozen."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["overfitting"], "hypotheses": ["train-mode-missing"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Dropout(0.5),
                         nn.Linear(128, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 4))


def build_data():
    return split(*blobs(spread=2.0))


loss_fn = nn.CrossEntropyLoss()


def train_epoch(model, loader, loss_fn, optimizer, scheduler):
    total, batches = 0.0, 0
    for x, y in loader:                       # no model.train() anywhere
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
        batches += 1
    return total / max(batches, 1)


def evaluate(model, loader, loss_fn):
    model.eval()
    total, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            total += loss_fn(out, y).item() * len(y)
            correct += (out.argmax(1) == y).sum().item()
            n += len(y)
    return {"loss": total / n, "accuracy": correct / n}
