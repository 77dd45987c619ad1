"""Broken: SGD with lr=1.0 on a regression MLP (the author meant 0.01): every step overshoots,
the loss grows geometrically and ends as Inf/NaN within a few dozen steps."""

import torch
from torch import nn

from examples.datasets import regression, split

EXPECTED = {"symptoms": ["nan"], "hypotheses": ["lr-too-high"]}


def build_data():
    return split(*regression())


def build_model():
    return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))


loss_fn = nn.MSELoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=1.0, momentum=0.9)
