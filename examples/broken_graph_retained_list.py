"""Broken: the training step keeps every batch's outputs in a module-level list (to compute an
epoch accuracy later) without .detach(), so each step's graph stays alive."""

from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["graph-retained"]}

history = []                                  # (outputs, targets) of every step


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    return split(*blobs())


loss_fn = nn.CrossEntropyLoss()


def train_step(model, batch, loss_fn, optimizer):
    model.train()
    x, y = batch
    optimizer.zero_grad()
    outputs = model(x)
    loss = loss_fn(outputs, y)
    loss.backward()
    optimizer.step()
    history.append((outputs, y))              # should be outputs.detach()
    return loss.item()
