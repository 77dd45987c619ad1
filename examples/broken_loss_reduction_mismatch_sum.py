"""Broken: reduction='sum' in the loss, with an SGD learning rate tuned for a mean: every step is
batch-size (32) times larger than intended."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["oscillating"], "hypotheses": ["loss-reduction-mismatch"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss(reduction="sum")   # meant: the default, reduction="mean"


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
