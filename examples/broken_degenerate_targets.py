"""Broken: the labels are rebuilt from a column with a filter that matches one class only, so every
training and validation target is 0. Validation looks perfect within an epoch; nothing is learned."""

from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["degenerate-targets"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs()
    y = (y == 7).long()          # meant y == 3 (or no filter at all): class 7 does not exist
    return split(x, y)


loss_fn = nn.CrossEntropyLoss()
