"""Broken: batch_size=2 for a network with BatchNorm, on a noisy classification set (overlapping
classes, some labels wrong). Each gradient, and each BatchNorm mean/variance, is estimated from two
samples, so the loss jumps from step to step without settling."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["oscillating"], "hypotheses": ["batch-too-small"]}


def build_data():
    x, y = blobs(spread=2.5, seed=4)
    g = torch.Generator().manual_seed(4)
    flip = torch.rand(len(y), generator=g) < 0.1
    y[flip] = torch.randint(0, 4, (int(flip.sum()),), generator=g)
    return split(x, y, batch_size=2)


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(),
                         nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4))


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
