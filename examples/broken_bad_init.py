"""Broken: a custom initialisation 25x too large; the untrained logits are huge."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["bad-init-scale"]}


def build_model():
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 4))
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, nn.Linear):
                layer.weight.normal_(0.0, 3.0)   # should be ~1/sqrt(fan_in) = 0.125
    return model


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.01)
