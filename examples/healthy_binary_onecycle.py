"""Healthy: binary classification with BCEWithLogitsLoss on one logit per sample, and OneCycleLR
stepped once per batch inside the user's own train_epoch, as that scheduler requires."""

import torch
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}
EPOCHS = 10
STEPS_PER_EPOCH = 16  # 512 training samples / batch size 32


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))


def build_data():
    x, y = blobs(classes=2, seed=4, spread=1.5)
    return split(x, y.float().unsqueeze(1))


loss_fn = nn.BCEWithLogitsLoss()


def build_optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-2)


def build_scheduler(optimizer):
    return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=EPOCHS * STEPS_PER_EPOCH)


def train_epoch(model, loader, loss_fn, optimizer, scheduler):
    model.train()
    total, n = 0.0, 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        scheduler.step()  # OneCycleLR: once per batch
        total += loss.item() * len(y)
        n += len(y)
    return total / max(n, 1)


def evaluate(model, loader, loss_fn):
    model.eval()
    total, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            logits = model(x)
            total += loss_fn(logits, y).item() * len(y)
            correct += ((logits > 0).float() == y).sum().item()
            n += len(y)
    model.train()
    return {"loss": total / n, "accuracy": correct / n}
