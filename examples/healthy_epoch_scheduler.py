"""Healthy: a StepLR schedule (in epochs) stepped once per epoch in the user's train_epoch."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": []}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def build_scheduler(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)


def train_epoch(model, loader, loss_fn, optimizer, scheduler):
    model.train()
    losses = []
    for x, y in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    scheduler.step()
    return sum(losses) / len(losses)
