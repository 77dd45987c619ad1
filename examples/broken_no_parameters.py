"""Broken: the constructor is misspelt (__int__), so nn.Module's own __init__ runs, no layer is
ever created and the model has no parameters: the optimizer gets an empty list (crash)."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["no-parameters"]}


class Classifier(nn.Module):
    def __int__(self):                      # meant: __init__
        super().__init__()
        self.hidden = nn.Linear(16, 32)
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(x)))


def build_model():
    return Classifier()


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()
