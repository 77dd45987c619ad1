"""Broken: a hand-written binary cross-entropy. Once the model grows confident, sigmoid(z) rounds to
exactly 1.0 in float32 and log(1 - p) is log(0) = -inf; the loss turns Inf, then the weights NaN."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["nan"], "hypotheses": ["missing-epsilon"]}
TASK = "binary"


def build_data():
    x, y = blobs(classes=2, seed=1, spread=0.6)
    return split(x, y.float().unsqueeze(1))


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def loss_fn(logits, target):
    p = torch.sigmoid(logits)
    return -(target * torch.log(p) + (1 - target) * torch.log(1 - p)).mean()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=0.05)
