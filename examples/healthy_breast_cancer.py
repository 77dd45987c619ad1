"""Healthy: binary classification on scikit-learn's bundled breast cancer data (real), standardised,
one logit per sample and BCEWithLogitsLoss on float targets of the same shape."""

from torch import nn

from examples._realdata import breast_cancer, loaders

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}
TASK = "binary"


def build_model():
    return nn.Sequential(nn.Linear(30, 32), nn.ReLU(), nn.Linear(32, 1))


def build_data():
    return loaders(*breast_cancer())


loss_fn = nn.BCEWithLogitsLoss()


def train_step(model, batch, loss_fn, optimizer):
    model.train()
    x, y = batch
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
