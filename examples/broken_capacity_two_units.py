"""Broken: three concentric rings classified by an MLP with a hidden layer of two units (a width of 2
left from a plotting experiment): the loss falls at first and then levels off far above what the data
allows; the rate is not what holds it there."""

import math

import torch
from torch.utils.data import TensorDataset
from torch import nn

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["capacity-too-small"]}


def _rings(n=3000, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.rand(n, generator=g) * 3
    t = torch.rand(n, generator=g) * 2 * math.pi
    x = torch.stack([r * torch.cos(t), r * torch.sin(t)], 1) + 0.05 * torch.randn(n, 2, generator=g)
    return x, r.floor().long() % 3


def build_model():
    return nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 3))


def build_data():
    x, y = _rings()
    return TensorDataset(x[:2400], y[:2400]), TensorDataset(x[2400:], y[2400:])


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)
