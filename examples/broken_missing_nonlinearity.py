"""Broken: a three-layer MLP written without activations on a task that is not linearly separable
(points inside vs outside a ring in two of the four features): the stack collapses into a single linear map."""

import torch
from torch import nn

from examples.datasets import split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["missing-nonlinearity"]}


def rings(n=768, features=4, seed=0):
    """Class = outside a ring in the first two features; the other features are distractors."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    y = (x[:, :2].norm(dim=1) > 1.18).long()  # about half the points inside the ring
    return x, y


def build_model():
    return nn.Sequential(nn.Linear(4, 64), nn.Linear(64, 64), nn.Linear(64, 2))  # no ReLU between


def build_data():
    return split(*rings())


loss_fn = nn.CrossEntropyLoss()
