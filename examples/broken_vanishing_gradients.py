"""Broken: a deep stack of sigmoid layers (an old tutorial's architecture). Each sigmoid passes back
at most a quarter of the gradient, so after eight of them the first layers receive almost nothing
and the loss stays flat."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["vanishing-gradients"]}


def build_model():
    layers = [nn.Linear(16, 64), nn.Sigmoid()]
    for _ in range(7):
        layers += [nn.Linear(64, 64), nn.Sigmoid()]
    layers.append(nn.Linear(64, 4))
    return nn.Sequential(*layers)


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
