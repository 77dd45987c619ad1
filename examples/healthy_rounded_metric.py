"""Healthy: a binary classifier trained on its probabilities; the step logs the loss with ``.item()`` and
counts correct predictions with rounded probabilities, which are no part of the loss."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": []}


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1), nn.Sigmoid())


def build_data():
    x, y = blobs(classes=2, spread=2.5)
    return split(x, y.float().unsqueeze(1))


loss_fn = nn.BCELoss()


def train_step(model, batch, loss_fn, optimizer):
    x, y = batch
    probs = model(x)
    loss = loss_fn(probs, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    correct = (torch.round(probs.detach()) == y).float().mean().item()   # a metric: outside the loss
    return loss.item() if correct >= 0 else loss.item()
