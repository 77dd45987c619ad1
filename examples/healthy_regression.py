"""Healthy: an MLP regressor with MSE on a smooth nonlinear target, standardised inputs and
outputs, and the user's own correct step and evaluation."""

import torch
from torch import nn

from examples.datasets import regression, split

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}
TASK = "regression"


def build_model():
    return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))


def build_data():
    return split(*regression())


loss_fn = nn.MSELoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=2e-3)


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
    total, n = 0.0, 0
    with torch.no_grad():
        for x, y in loader:
            total += loss_fn(model(x), y).item() * len(y)
            n += len(y)
    model.train()
    return {"loss": total / n}
