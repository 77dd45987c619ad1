"""Healthy: regression on scikit-learn's bundled diabetes data (real), standardised target of shape
(n, 1) matching the model's output, MSE loss."""

import torch
from torch import nn

from examples._realdata import diabetes, loaders

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}
TASK = "regression"


def build_model():
    return nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))


def build_data():
    return loaders(*diabetes())


loss_fn = nn.MSELoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=3e-3)
