"""Broken: a binary classifier emits raw logits but the loss is BCELoss, which wants probabilities (crash)."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["loss-output-mismatch"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))   # no Sigmoid at the end


def build_data():
    x, y = blobs(classes=2)
    return split(x, y.float().unsqueeze(1))


loss_fn = nn.BCELoss()   # meant: nn.BCEWithLogitsLoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3)
