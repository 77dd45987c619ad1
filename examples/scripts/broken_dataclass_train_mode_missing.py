# nnwizard-expect: train-mode-missing
# nnwizard-symptom: overfitting
"""A config dataclass drives the run; run_epoch() and validate() are plain functions. Planted
fault: validate() puts the model in eval mode and nothing puts it back: run_epoch() never calls
model.train(), so from the second epoch on Dropout is off and BatchNorm uses frozen statistics."""

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Config:
    n_train: int = 384
    n_val: int = 256
    features: int = 16
    hidden: int = 128
    classes: int = 4
    dropout: float = 0.5
    batch_size: int = 32
    lr: float = 2e-3
    epochs: int = 4
    seed: int = 0


def make_data(cfg: Config):
    g = torch.Generator().manual_seed(cfg.seed)
    centers = torch.randn(cfg.classes, cfg.features, generator=g) * 1.5
    n = cfg.n_train + cfg.n_val
    y = torch.randint(0, cfg.classes, (n,), generator=g)
    x = centers[y] + 2.0 * torch.randn(n, cfg.features, generator=g)
    x = (x - x.mean(0)) / x.std(0)
    train = TensorDataset(x[:cfg.n_train], y[:cfg.n_train])
    val = TensorDataset(x[cfg.n_train:], y[cfg.n_train:])
    return (DataLoader(train, batch_size=cfg.batch_size, shuffle=True),
            DataLoader(val, batch_size=cfg.batch_size))


def build_model(cfg: Config) -> nn.Module:
    return nn.Sequential(
        nn.Linear(cfg.features, cfg.hidden), nn.BatchNorm1d(cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout),
        nn.Linear(cfg.hidden, cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout),
        nn.Linear(cfg.hidden, cfg.classes),
    )


def run_epoch(model, loader, criterion, optimizer):
    running = 0.0
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running += loss.item()
    return running / len(loader)


def validate(model, loader, criterion):
    model.eval()
    losses, hits, seen = [], 0, 0
    with torch.no_grad():
        for x, y in loader:
            logits = model(x)
            losses.append(criterion(logits, y).item())
            hits += (logits.argmax(-1) == y).sum().item()
            seen += y.numel()
    return sum(losses) / len(losses), hits / seen


def main(cfg: Config = Config()):
    torch.manual_seed(cfg.seed)
    train_loader, val_loader = make_data(cfg)
    model = build_model(cfg)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    for epoch in range(cfg.epochs):
        train_loss = run_epoch(model, train_loader, criterion, optimizer)
        val_loss, val_acc = validate(model, val_loader, criterion)
        print(f"epoch {epoch}: train_loss={train_loss:.4f} val_loss={val_loss:.4f} val_acc={val_acc:.3f}")


if __name__ == "__main__":
    main()
