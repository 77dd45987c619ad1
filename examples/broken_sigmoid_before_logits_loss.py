"""Broken: a binary classifier whose training step squashes the logit with torch.sigmoid and then
calls BCEWithLogitsLoss, which applies the sigmoid again: predictions are confined to (0.5, 0.73)."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["loss-output-mismatch"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Flatten(0))


def build_data():
    x, y = blobs(classes=2)
    return split(x, y.float())


loss_fn = nn.BCEWithLogitsLoss()


def train_step(model, batch, loss_fn, optimizer):
    x, y = batch
    model.train()
    optimizer.zero_grad()
    p = torch.sigmoid(model(x))              # probabilities...
    loss = loss_fn(p, y)                     # ...into a loss that wants logits
    loss.backward()
    optimizer.step()
    return loss.item()
