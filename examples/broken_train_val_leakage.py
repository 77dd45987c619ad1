"""Broken: the data set was 'doubled' with flipped, slightly noisy copies before the train/val split,
so most validation images are augmented copies of training images: validation looks too good."""

import torch
from torch import nn

from examples.datasets import images, split

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["train-val-leakage"]}


def build_model():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 6 * 6, 4),
    )


def build_data():
    x, y = images(n=384)
    g = torch.Generator().manual_seed(1)
    augmented = x.flip(-1) + 0.02 * torch.randn(x.shape, generator=g)   # augmentation to "get more data"
    x, y = torch.cat([x, augmented]), torch.cat([y, y])
    order = torch.randperm(len(x), generator=g)
    return split(x[order], y[order])          # split AFTER augmenting: copies land on both sides


loss_fn = nn.CrossEntropyLoss()
