"""Broken: 'freeze the backbone's Linear layers' looped over the whole model and froze the classifier too;
only the BatchNorm layers still train."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["frozen-parameters"]}


def build_model():
    model = nn.Sequential(
        nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(),
        nn.Linear(32, 32), nn.BatchNorm1d(32), nn.ReLU(),
        nn.Linear(32, 4),
    )
    backbone = model[:-1]
    for m in model.modules():        # meant: backbone.modules(), the classifier must train
        if isinstance(m, nn.Linear):
            m.requires_grad_(False)
    return model


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
