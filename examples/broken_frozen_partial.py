"""Broken: 'freeze the backbone' by layer type also froze the classifier; only BatchNorm still trains."""

import torch
from torch import nn

from examples.datasets import images, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["frozen-parameters"]}


def build_model():
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 4),
    )
    for m in model.modules():        # meant: only the Conv2d layers of the backbone
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            m.requires_grad_(False)
    return model


def build_data():
    return split(*images())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
