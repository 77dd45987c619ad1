"""Broken: every Linear layer's bias is initialised to -1 ("to make the features sparse"). With
standardised inputs almost every pre-activation is negative, so most ReLU units output zero for every
sample, pass no gradient, and the loss barely moves."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["dead-relu"]}


def build_model():
    model = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
    for layer in model:
        if isinstance(layer, nn.Linear):
            nn.init.constant_(layer.bias, -1.0)
    return model


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05)
