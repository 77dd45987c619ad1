"""Broken: class ids read from a table come out as a column, shape (N, 1), and go to
CrossEntropyLoss, which wants one class index per sample, shape (N) (crash)."""

from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["target-shape-mismatch"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs()
    return split(x, y.reshape(-1, 1))   # the label column keeps its second dimension


loss_fn = nn.CrossEntropyLoss()
