"""Broken: a GRU classifier that averages its states over time; the data loader yields (batch, time,
features) but the GRU defaults to (time, batch, features), so each sample's state carries the
samples before it in the batch."""

import torch
from torch import nn

from examples._realdata import loaders, sequences

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["axes-swapped"]}


class GRUClassifier(nn.Module):
    def __init__(self, features=4, hidden=16, classes=4):
        super().__init__()
        self.gru = nn.GRU(features, hidden)        # batch_first defaults to False
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out.mean(dim=1))


def build_model():
    return GRUClassifier()


def build_data():
    return loaders(*sequences(n=320, seed=1), standardise=False)


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=3e-3)
