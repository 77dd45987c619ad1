"""Healthy: gradient clipping and accumulation over 2 micro-batches, each loss divided by 2."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["oscillating"], "hypotheses": []}
ACCUM = 2


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train_step(model, batch, loss_fn, optimizer):
    model.train()
    x, y = batch
    optimizer.zero_grad(set_to_none=True)
    total = 0.0
    for xs, ys in zip(x.chunk(ACCUM), y.chunk(ACCUM)):
        loss = loss_fn(model(xs), ys) / ACCUM
        loss.backward()
        total += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    return total
