"""Broken (mildly): the validation DataLoader shuffles, so per-batch validation numbers and saved
predictions come out in a different order on every evaluation."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from examples.datasets import blobs

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["val-shuffled"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs()
    train = DataLoader(TensorDataset(x[:-256], y[:-256]), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(TensorDataset(x[-256:], y[-256:]), batch_size=32, shuffle=True)   # copied from the line above
    return train, val


loss_fn = nn.CrossEntropyLoss()
