"""Broken: a wine classifier (scikit-learn's bundled wine data) whose forward ends in
F.log_softmax(..., dim=0), written for a single vector, so probabilities are normalised over the
samples of the batch instead of over the three classes."""

import torch
import torch.nn.functional as F
from torch import nn

from examples._realdata import loaders, wine

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["softmax-wrong-dim"]}


class WineNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Linear(13, 32)
        self.out = nn.Linear(32, 3)

    def forward(self, x):
        x = F.relu(self.hidden(x))
        return F.log_softmax(self.out(x), dim=0)     # should be dim=1 (the classes)


def build_model():
    return WineNet()


def build_data():
    return loaders(*wine(), batch_size=16)


loss_fn = nn.NLLLoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=3e-3)
