"""Broken: the training rows are stored sorted by class and the loader does not shuffle, so every
batch holds one class and the loss swings from class to class."""

import torch
from torch import nn

from examples.datasets import blobs

EXPECTED = {"symptoms": ["oscillating"], "hypotheses": ["train-not-shuffled"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs()
    order = torch.argsort(y, stable=True)       # the export came sorted by label
    x, y = x[order], y[order]
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(2))
    val = perm[:256]
    keep = torch.ones(len(y), dtype=torch.bool)
    keep[val] = False
    xt, yt = x[keep], y[keep]                    # still sorted by label
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xt, yt), batch_size=32, shuffle=False)
    valid = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[val], y[val]), batch_size=32)
    return train, valid


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05)
