"""Broken: a residual sum written in place after tanh overwrites the output autograd saved (crash)."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["inplace-modification"]}


class ResidualNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.skip = nn.Linear(16, 32)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        h = torch.tanh(self.fc1(x))
        h += self.skip(x)            # in place: tanh's backward needs its output unchanged
        return self.head(h)


def build_model():
    return ResidualNet()


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()
