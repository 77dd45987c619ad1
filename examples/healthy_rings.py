"""Healthy: the three concentric rings of broken_capacity_two_units, with a hidden layer of 64 units."""

from torch import nn
import torch

from examples.broken_capacity_two_units import _rings
from torch.utils.data import TensorDataset

EXPECTED = {"symptoms": ["flat"], "hypotheses": []}


def build_model():
    return nn.Sequential(nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))


def build_data():
    x, y = _rings()
    return TensorDataset(x[:2400], y[:2400]), TensorDataset(x[2400:], y[2400:])


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)
