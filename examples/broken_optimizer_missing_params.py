"""Broken: per-module learning rates in build_optimizer, but the param groups forget the encoder."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["optimizer-missing-params"]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 64), nn.ReLU())
        self.body = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.body(self.encoder(x)))


def build_model():
    return Net()


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.Adam([
        {"params": model.body.parameters(), "lr": 3e-4},
        {"params": model.head.parameters()},            # model.encoder is in no group
    ], lr=1e-3)
