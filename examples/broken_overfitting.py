"""Broken: a wide, deep MLP trained on only 64 noisy samples (a fifth of the labels are wrong)
with no regularisation: it memorises the training set and validation loss climbs."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["overfitting"], "hypotheses": ["overfitting"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4))


def build_data():
    x, y = blobs(n=320, spread=2.5, seed=3)
    g = torch.Generator().manual_seed(1)
    noisy = torch.rand(len(y), generator=g) < 0.2
    y = torch.where(noisy, torch.randint(0, 4, (len(y),), generator=g), y)
    return split(x, y, val=256, batch_size=32)


loss_fn = nn.CrossEntropyLoss()
