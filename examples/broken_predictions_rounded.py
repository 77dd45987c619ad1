"""Broken: a binary classifier's step rounds the predicted probabilities before the loss, "to train on
what the model will predict". The gradient of round() is zero everywhere: the loss is computed, backward
runs, every parameter gets a gradient of exactly 0 and nothing learns."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["loss-output-mismatch"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())


def build_data():
    x, y = blobs(classes=2, spread=2.5)
    return split(x, y.float().unsqueeze(1))


loss_fn = nn.MSELoss()


def train_step(model, batch, loss_fn, optimizer):
    x, y = batch
    loss = loss_fn(torch.round(model(x)), y)       # hard 0/1 predictions: no gradient passes round()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
