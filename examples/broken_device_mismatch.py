"""Broken: a positional table is created on a fixed device inside __init__ and kept as a plain
attribute, not a buffer, so model.to(device) never moves it; the forward pass adds it to inputs
that live on another device (crash).

The "meta" device stands in for the second device so that the bug reproduces on a CPU-only
machine: on a GPU the same code written with device="cuda" (or with the table left on the CPU
while the model moves to "cuda") fails the same way."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["device-mismatch"]}
TABLE_DEVICE = "meta"   # in the real program: "cuda" while the batches stay on the CPU, or vice versa


class Offset(nn.Module):
    def __init__(self):
        super().__init__()
        self.offset = torch.zeros(16, device=TABLE_DEVICE)   # should be self.register_buffer("offset", ...)
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x):
        return self.net(x + self.offset)


def build_model():
    return Offset()


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()
