"""Broken: the classifier ends in nn.Softmax, and CrossEntropyLoss applies log_softmax again."""

from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["double-softmax"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4), nn.Softmax(dim=1))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()
