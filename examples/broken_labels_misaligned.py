"""Broken: the inputs were shuffled before the split but the labels were not: every label now
belongs to some other sample, so nothing generalises."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["labels-misaligned"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(3))
    x = x[order]                      # meant: x, y = x[order], y[order]
    return split(x, y)


loss_fn = nn.CrossEntropyLoss()
