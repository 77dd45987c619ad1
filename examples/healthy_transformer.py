"""Healthy: a small TransformerEncoder over (batch, time, features) sequences, built with
batch_first=True so attention runs along time, never across the samples of a batch."""

import torch
from torch import nn

from examples._realdata import loaders, sequences

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}


class SequenceClassifier(nn.Module):
    def __init__(self, features=4, width=16, steps=12, classes=4):
        super().__init__()
        self.embed = nn.Linear(features, width)
        self.position = nn.Parameter(torch.zeros(1, steps, width))
        layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=32, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, x):                      # x: (batch, time, features)
        h = self.encoder(self.embed(x) + self.position)
        return self.head(h.mean(dim=1))        # pool over time


def build_model():
    return SequenceClassifier()


def build_data():
    return loaders(*sequences(), standardise=False)


loss_fn = nn.CrossEntropyLoss()
