"""Broken: weight_decay=0.3 passed to plain Adam (L2 added to the gradient, not decoupled as in
AdamW) pins the weights near zero, so training and validation loss both stall high."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["underfitting"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs(spread=1.5))


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=0.3)


loss_fn = nn.CrossEntropyLoss()
