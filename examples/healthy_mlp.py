"""Healthy: a small MLP classifier on Gaussian blobs, the wizard's reference loop."""

from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()
