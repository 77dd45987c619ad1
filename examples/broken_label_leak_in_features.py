"""Broken: the target column was never dropped from the feature table, so the label is an input."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["label-leak-in-features"]}


def build_model():
    return nn.Sequential(nn.Linear(17, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs(spread=3.0)
    table = torch.cat([x, y.float().unsqueeze(1)], dim=1)   # meant: features only, df.drop(columns="label")
    return split(table, y)


loss_fn = nn.CrossEntropyLoss()
