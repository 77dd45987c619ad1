"""Broken: a typo leaves a one-unit bottleneck (`nn.Linear(64, 1)` where 64 was meant) in the
middle of an otherwise sensible MLP, so ten classes have to squeeze through one ReLU unit."""

from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["capacity-too-small"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1), nn.Linear(1, 10))


def build_data():
    return split(*blobs(n=1024, classes=10))


loss_fn = nn.CrossEntropyLoss()
