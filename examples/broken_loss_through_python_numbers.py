"""Broken: the training step collects the predictions as Python numbers (``.item()`` per sample) and
rebuilds a tensor from them for the loss. The loss has a graph again (``requires_grad=True`` on the new
tensor), backward runs without complaint, and the model's own parameters never get a gradient: the loss
sits where it started."""

import torch
from torch import nn

from examples.datasets import regression, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["disconnected-parameters"]}


def build_model():
    return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))


def build_data():
    return split(*regression())


loss_fn = nn.MSELoss()


def train_step(model, batch, loss_fn, optimizer):
    x, y = batch
    out = model(x)
    preds = torch.tensor([[value.item()] for value in out], requires_grad=True)   # a copy of the values, no graph
    loss = loss_fn(preds, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
