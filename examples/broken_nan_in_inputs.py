"""Broken: a tabular data set with missing readings stored as NaN (a sensor dropped out); nothing
imputes them before they reach the model."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["nan"], "hypotheses": ["nan-in-inputs"]}


def build_data():
    x, y = blobs(seed=3)
    g = torch.Generator().manual_seed(3)
    dropped = torch.randperm(len(x), generator=g)[:12]      # 12 rows lost their "sensor 5" reading
    x[dropped, 5] = float("nan")
    return split(x, y)


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


loss_fn = nn.CrossEntropyLoss()
