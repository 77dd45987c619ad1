"""Broken: the validation DataLoader shuffles, and evaluate looks at its first three batches only
(a quick check during training): every evaluation scores a different random subset, so the
validation numbers move even when the model does not."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from examples.datasets import blobs

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["val-shuffled"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs()
    train = DataLoader(TensorDataset(x[:-256], y[:-256]), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(TensorDataset(x[-256:], y[-256:]), batch_size=32, shuffle=True)   # copied from the line above
    return train, val


loss_fn = nn.CrossEntropyLoss()


@torch.no_grad()
def evaluate(model, loader, loss_fn, batches=3):
    model.eval()
    total, correct, n = 0.0, 0, 0
    for i, (x, y) in enumerate(loader):
        if i == batches:                   # fine on an ordered loader: always the same samples
            break
        out = model(x)
        total += loss_fn(out, y).item() * len(y)
        correct += (out.argmax(1) == y).sum().item()
        n += len(y)
    return {"loss": total / n, "accuracy": correct / n}
