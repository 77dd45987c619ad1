"""Broken: a linear warm-up written as a multiplier of 100 ("100 %") instead of 1.0. Over its first
epochs the rate only climbs towards the configured one, so a short run looks fine; read ahead, the
schedule carries the rate to 100x the optimizer's lr, where this model does not train."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["auto"], "hypotheses": ["lr-too-high"]}
WARMUP_STEPS = 1000
PEAK = 100          # meant 1.0


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def build_scheduler(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / WARMUP_STEPS) * PEAK)


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
