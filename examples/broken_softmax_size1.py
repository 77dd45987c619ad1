"""Broken: a binary classifier with one output unit normalises it with softmax over dimension 1,
which has size 1: every prediction is exactly 1.0, whatever the input, and nothing can be learned."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["softmax-wrong-dim"]}


class Binary(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return torch.softmax(self.net(x), dim=1)    # one column: softmax of it is 1.0


def build_model():
    return Binary()


def build_data():
    x, y = blobs(classes=2)
    return split(x, y.float().unsqueeze(1))


loss_fn = nn.BCELoss()
