"""Broken: the model defines its own train(self, x, y) training helper, which replaces
nn.Module.train(mode): every model.train() / model.eval() call now raises a TypeError (crash)."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["module-method-shadowed"]}


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)

    def train(self, x, y):                  # shadows nn.Module.train(mode=True)
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        loss = nn.functional.cross_entropy(self(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.item()


def build_model():
    return Classifier()


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()
