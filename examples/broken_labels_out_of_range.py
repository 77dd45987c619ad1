"""Broken: class labels numbered 1..C (from a CSV) with C model outputs: class C is out of range (crash)."""

from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["labels-out-of-range"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs()
    return split(x, y + 1)   # labels 1..4 for 4 outputs


loss_fn = nn.CrossEntropyLoss()
