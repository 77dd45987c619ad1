"""Broken: gradient accumulation over 4 micro-batches without dividing the loss by 4, so the SGD
step is 4x what the learning rate was tuned for."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["oscillating"], "hypotheses": ["loss-reduction-mismatch"]}
ACCUM = 4


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train_epoch(model, loader, loss_fn, optimizer, scheduler):
    model.train()
    total, n = 0.0, 0
    optimizer.zero_grad()
    for i, (x, y) in enumerate(loader):
        loss = loss_fn(model(x), y)
        loss.backward()               # meant: (loss / ACCUM).backward()
        if (i + 1) % ACCUM == 0:
            optimizer.step()
            optimizer.zero_grad()
        total, n = total + loss.item(), n + 1
    return total / max(n, 1)
