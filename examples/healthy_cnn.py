"""Healthy: a CNN with BatchNorm and Dropout and the user's own, correct step and evaluation."""

import torch
from torch import nn

from examples.datasets import images, split

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}


def build_model():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.2), nn.Linear(8 * 6 * 6, 4),
    )


def build_data():
    return split(*images())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=3e-3)


def train_step(model, batch, loss_fn, optimizer):
    model.train()
    x, y = batch
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()


def evaluate(model, loader, loss_fn):
    model.eval()
    total, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = model(x)
            total += loss_fn(out, y).item() * len(y)
            correct += (out.argmax(1) == y).sum().item()
            n += len(y)
    model.train()
    return {"loss": total / n, "accuracy": correct / n}
