"""Broken: evaluate counts a prediction as right when the predicted probability equals the label
(``probs == y``). Probabilities of a sigmoid are never exactly 0 or 1, so the accuracy is 0 for any
model, however well it classifies."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["metric-wrong"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))


def build_data():
    x, y = blobs(classes=2, spread=2.5)
    return split(x, y.float().unsqueeze(1))


loss_fn = nn.BCEWithLogitsLoss()


@torch.no_grad()
def evaluate(model, loader, loss_fn):
    model.eval()
    correct = total = 0
    loss = 0.0
    for x, y in loader:
        out = model(x)
        loss += loss_fn(out, y).item() * len(y)
        probs = torch.sigmoid(out)
        correct += (probs == y).sum().item()          # meant: ((probs > 0.5).float() == y)
        total += len(y)
    return {"loss": loss / total, "accuracy": correct / total}
