"""Broken: a three-layer MLP written without activations on a task that is not linearly separable
(points inside vs outside a ring): the stack collapses into a single linear map."""

import torch
from torch import nn

from examples.datasets import split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["missing-nonlinearity"]}


def rings(n=768, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=g)
    y = (x.norm(dim=1) > 1.18).long()  # about half the points inside the ring
    return x, y


def build_model():
    return nn.Sequential(nn.Linear(2, 64), nn.Linear(64, 64), nn.Linear(64, 2))  # no ReLU between


def build_data():
    return split(*rings())


loss_fn = nn.CrossEntropyLoss()
