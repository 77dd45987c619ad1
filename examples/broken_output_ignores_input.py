"""Broken: a stack of residual blocks that starts from a learned initial state. The loop was meant to
start from the embedded input (``h = self.embed(x)``) but starts from ``self.h0`` and never reads ``x``:
every sample gets the same prediction. The blocks and the head still get gradients, so the loop looks
sound; the loss falls to what a constant prediction scores and stops there."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["output-ignores-input"]}


class Residual(nn.Module):
    def __init__(self, width=32, depth=3):
        super().__init__()
        self.embed = nn.Linear(16, width)
        self.h0 = nn.Parameter(torch.randn(1, width) * 0.5)
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.head = nn.Linear(width, 4)

    def forward(self, x):
        h = self.h0.expand(len(x), -1)          # meant: h = self.embed(x)
        for block in self.blocks:
            h = h + torch.tanh(block(h))
        return self.head(h)


def build_model():
    return Residual()


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()
