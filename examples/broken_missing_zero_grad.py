"""Broken: the user's train_step never clears gradients, so every step adds onto the running sum."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["oscillating"], "hypotheses": ["missing-zero-grad"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train_step(model, batch, loss_fn, optimizer):
    model.train()
    x, y = batch
    loss = loss_fn(model(x), y)      # optimizer.zero_grad() is missing
    loss.backward()
    optimizer.step()
    return loss.item()
