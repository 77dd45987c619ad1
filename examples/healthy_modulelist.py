"""Healthy: a residual MLP whose hidden blocks live in an nn.ModuleList (so they are registered,
trained, moved and saved), plus a learnable output scale declared as an nn.Parameter."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}


class ResidualMLP(nn.Module):
    def __init__(self, features=16, width=64, depth=3, classes=4):
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.ReLU())
                                     for _ in range(depth)])
        self.out = nn.Linear(width, classes)
        self.scale = nn.Parameter(torch.ones(1))
        self.trace = [self.inp, self.out]      # a plain list of references to registered layers is fine

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h) * self.scale


def build_model():
    return ResidualMLP()


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()
