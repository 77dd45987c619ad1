"""Broken: class labels stored as float (read from a CSV), fed to CrossEntropyLoss (crash)."""

from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["labels-wrong-dtype"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs()
    return split(x, y.float())


loss_fn = nn.CrossEntropyLoss()
