"""Broken: the training step turns the logits into probabilities with F.softmax before
CrossEntropyLoss, which applies log_softmax itself: softmax twice. The model's last layer is a
plain Linear, so only what reaches the loss shows it."""

import torch.nn.functional as F
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": ["double-softmax"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def train_step(model, batch, loss_fn, optimizer):
    x, y = batch
    model.train()
    optimizer.zero_grad()
    probs = F.softmax(model(x), dim=1)      # "the loss wants probabilities"
    loss = loss_fn(probs, y)
    loss.backward()
    optimizer.step()
    return loss.item()
