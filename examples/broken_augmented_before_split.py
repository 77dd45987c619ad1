"""Broken: build_data augments the table (two noisy copies of every row) and then splits it at random
into training and validation: most validation rows have a near-identical copy in the training set, so
validation measures memory, not generalisation."""

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch import nn

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["train-val-leakage"]}


def build_model():
    return nn.Sequential(nn.Linear(24, 128), nn.ReLU(), nn.Linear(128, 3))


def build_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(400, 24, generator=g)
    y = (x[:, :3] + 1.5 * torch.randn(400, 3, generator=g)).argmax(1)       # noisy labels
    x = torch.cat([x, x + 0.03 * torch.randn(x.shape, generator=g), x + 0.03 * torch.randn(x.shape, generator=g)])
    y = torch.cat([y, y, y])
    order = torch.randperm(len(x), generator=g)
    train, val = order[:960], order[960:]
    return (DataLoader(TensorDataset(x[train], y[train]), batch_size=32, shuffle=True, generator=g),
            DataLoader(TensorDataset(x[val], y[val]), batch_size=64))


loss_fn = nn.CrossEntropyLoss()
