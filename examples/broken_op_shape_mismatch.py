"""Broken: a two-branch model joins its branches with torch.cat along dimension 0 (the batch)
instead of 1 (the features); the branches have different widths, so cat raises (crash)."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["op-shape-mismatch"]}


class TwoBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.wide = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.narrow = nn.Sequential(nn.Linear(16, 8), nn.ReLU())
        self.head = nn.Linear(40, 4)

    def forward(self, x):
        a, b = self.wide(x), self.narrow(x)
        joined = torch.cat([a, b], dim=0)   # meant dim=1: (N, 32) + (N, 8) -> (N, 40)
        return self.head(joined)


def build_model():
    return TwoBranch()


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()
