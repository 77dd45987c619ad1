"""Broken: train_epoch sums the loss tensors themselves (total_loss += loss) instead of
loss.item(), so every step's autograd graph stays chained to the running total; on a GPU memory
climbs every step until CUDA runs out of memory."""

from torch import nn

from examples._realdata import breast_cancer, loaders

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["graph-retained"]}
TASK = "binary"


def build_model():
    return nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 1))


def build_data():
    return loaders(*breast_cancer())


loss_fn = nn.BCEWithLogitsLoss()


def train_epoch(model, loader, loss_fn, optimizer, scheduler):
    model.train()
    total_loss = 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss                    # should be loss.item()
    return total_loss / len(loader)
