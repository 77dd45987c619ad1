"""Broken: plain SGD at lr=1e-5 on a regression (a rate copied from a fine-tuning recipe for Adam):
every update moves the weights by a millionth, and a sweep up to 100x the rate still does not reach
the rates SGD trains at."""

import torch
from torch import nn
from torch.utils.data import TensorDataset

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["lr-too-low"]}


def build_model():
    return nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 1))


def build_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2000, 12, generator=g)
    y = torch.tanh(x @ torch.randn(12, 1, generator=g)) * 2 + 0.05 * torch.randn(2000, 1, generator=g)
    return TensorDataset(x[:1600], y[:1600]), TensorDataset(x[1600:], y[1600:])


loss_fn = nn.MSELoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=1e-5)
