"""Broken: the forward keeps a detached copy of the encoder features for plotting, then feeds that
copy to the head, so the encoder never receives a gradient."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["disconnected-parameters"]}


class WideDeep(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.skip = nn.Linear(16, 8)
        self.head = nn.Linear(40, 4)

    def forward(self, x):
        h = self.encoder(x)
        self.features = h.detach()                      # kept for the embedding plot
        return self.head(torch.cat([self.features, self.skip(x)], dim=1))   # meant: h


def build_model():
    return WideDeep()


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()
