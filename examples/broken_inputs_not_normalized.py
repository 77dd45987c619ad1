"""Broken: tabular features left in their raw units (hundreds to thousands): the scaler was skipped."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["inputs-not-normalized"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs()
    g = torch.Generator().manual_seed(1)
    units = 10 ** torch.randint(2, 4, (16,), generator=g).float()   # prices, areas, counts...
    raw = x * units + 3 * units                                     # never standardised
    return split(raw, y)


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=1e-3)
