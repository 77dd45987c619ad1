"""Broken: OneCycleLR sized for every batch, but stepped once per epoch in train_epoch, so the
learning rate stays near its warm-up floor for the whole run."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["underfitting"], "hypotheses": ["scheduler-misplaced"]}
EPOCHS, STEPS_PER_EPOCH = 10, 16


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def build_scheduler(optimizer):
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH)


def train_epoch(model, loader, loss_fn, optimizer, scheduler):
    model.train()
    losses = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    scheduler.step()                  # OneCycleLR must step after every batch
    return sum(losses) / len(losses)
