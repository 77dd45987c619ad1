"""Healthy: an MLP on scikit-learn's bundled handwritten digits (real data), reference loop."""

from torch import nn

from examples._realdata import digits, loaders

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}


def build_model():
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))


def build_data():
    return loaders(*digits())


loss_fn = nn.CrossEntropyLoss()
