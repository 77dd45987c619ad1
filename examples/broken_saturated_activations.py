"""Broken: the hidden tanh layers are initialised from a standard normal ("randn weights"), so their
pre-activations have a standard deviation of 4-8 and nearly every tanh output sits at +-1 where its
slope is ~0. The head keeps PyTorch's default init, so the first loss looks normal, yet training
crawls."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["saturated-activations"]}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh())
        self.head = nn.Linear(64, 4)
        for layer in self.hidden:
            if isinstance(layer, nn.Linear):
                nn.init.normal_(layer.weight, 0.0, 1.0)

    def forward(self, x):
        return self.head(self.hidden(x))


def build_model():
    return Net()


def build_data():
    return split(*blobs(spread=2.0))


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.01)
