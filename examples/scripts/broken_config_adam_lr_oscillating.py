# nnwizard-expect: lr-too-high
# nnwizard-symptom: oscillating
"""A config-dict training script (argparse overrides, a train_one_epoch() helper, periodic logging)
on sklearn's digits. Planted fault: Adam's learning rate is 0.1, 100x its usual 1e-3. Nothing NaNs
and every loop audit is clean: the loss just jumps around a level above chance. Only rerunning the
script at a scaled learning rate shows that lr/10 trains and the configured rate does not."""

import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CONFIG = {"lr": 0.1, "batch_size": 32, "epochs": 3, "hidden": 128, "log_every": 10}


def make_loaders(batch_size):
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    y = torch.tensor(data.target, dtype=torch.long)
    return (DataLoader(TensorDataset(x[:1200], y[:1200]), batch_size=batch_size, shuffle=True),
            DataLoader(TensorDataset(x[1200:], y[1200:]), batch_size=256))


def train_one_epoch(model, loader, criterion, optimizer, epoch, log_every):
    model.train()
    for i, (features, labels) in enumerate(loader):
        optimizer.zero_grad()
        loss = criterion(model(features), labels)
        loss.backward()
        optimizer.step()
        if i % log_every == 0:
            print(f"epoch {epoch} batch {i}: loss {loss.item():.4f}")


@torch.no_grad()
def validate(model, loader):
    model.eval()
    correct = total = 0
    for features, labels in loader:
        correct += (model(features).argmax(1) == labels).sum().item()
        total += len(labels)
    return correct / total


def main():
    parser = argparse.ArgumentParser()
    for key, value in CONFIG.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=type(value), default=value)
    cfg = parser.parse_args()
    torch.manual_seed(0)
    train_loader, val_loader = make_loaders(cfg.batch_size)
    model = nn.Sequential(nn.Linear(64, cfg.hidden), nn.ReLU(), nn.Linear(cfg.hidden, 10))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    for epoch in range(cfg.epochs):
        train_one_epoch(model, train_loader, criterion, optimizer, epoch, cfg.log_every)
        print(f"epoch {epoch}: val accuracy {validate(model, val_loader):.3f}")


if __name__ == "__main__":
    main()
