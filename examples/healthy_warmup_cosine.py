"""Healthy: a linear warm-up to the configured rate over 100 steps, then a cosine decay over the rest
of a 30-epoch run, stepped after every batch."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}
EPOCHS, WARMUP = 30, 100


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def build_scheduler(optimizer):
    total = EPOCHS * 16   # 512 training samples in batches of 32
    warm = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.01, total_iters=WARMUP)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total - WARMUP)
    return torch.optim.lr_scheduler.SequentialLR(optimizer, [warm, cosine], milestones=[WARMUP])


def train_epoch(model, loader, loss_fn, optimizer, scheduler):
    model.train()
    total = 0.0
    for x, y in loader:
        loss = loss_fn(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        total += loss.item()
    return total / len(loader)
