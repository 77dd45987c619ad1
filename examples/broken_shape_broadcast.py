"""Broken: a regressor outputs (N, 1) but the targets are (N,): MSELoss broadcasts them to (N, N)."""

from torch import nn

from examples.datasets import regression, split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["shape-broadcast"]}


def build_model():
    return nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 1))


def build_data():
    x, y = regression()
    return split(x, y.squeeze(1))   # targets flattened to (N,), the model still returns (N, 1)


loss_fn = nn.MSELoss()
