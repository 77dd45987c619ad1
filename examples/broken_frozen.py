"""Broken: a 'freeze the backbone' loop that froze the whole model, head included."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["frozen-parameters"]}


def build_model():
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    for p in model.parameters():   # meant: model[:-1].parameters()
        p.requires_grad = False
    return model


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)
