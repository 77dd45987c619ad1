"""Healthy: scikit-learn's bundled wine data (real, 13 measurements on very different scales),
standardised with training statistics; an MLP with the user's own correct epoch and evaluation."""

import torch
from torch import nn

from examples._realdata import loaders, wine

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}


def build_model():
    return nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 3))


def build_data():
    return loaders(*wine(), batch_size=16)


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=3e-3)


def train_epoch(model, loader, loss_fn, optimizer, scheduler):
    model.train()
    total, batches = 0.0, 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
        batches += 1
    if scheduler is not None:
        scheduler.step()
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
