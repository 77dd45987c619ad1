# nnwizard-expect:
# nnwizard-symptom: auto
"""Healthy: a config dataclass and a Trainer class (fit / _train_epoch / _evaluate), BatchNorm and
Dropout, gradient clipping, a cosine schedule sized in steps and stepped after every optimizer
step, evaluation in eval mode under no_grad with train mode restored by _train_epoch."""

from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Config:
    features: int = 16
    classes: int = 4
    hidden: int = 64
    dropout: float = 0.3
    batch_size: int = 32
    epochs: int = 4
    lr: float = 3e-3
    weight_decay: float = 1e-4
    clip: float = 1.0
    seed: int = 0


def make_loaders(cfg: Config):
    g = torch.Generator().manual_seed(cfg.seed)
    centers = torch.randn(cfg.classes, cfg.features, generator=g) * 2
    y = torch.randint(0, cfg.classes, (768,), generator=g)
    x = centers[y] + torch.randn(768, cfg.features, generator=g)
    x = (x - x.mean(0)) / x.std(0)
    train = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=cfg.batch_size, shuffle=True)
    val = DataLoader(TensorDataset(x[512:], y[512:]), batch_size=128)
    return train, val


class Trainer:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        torch.manual_seed(cfg.seed)
        self.model = nn.Sequential(
            nn.Linear(cfg.features, cfg.hidden), nn.BatchNorm1d(cfg.hidden), nn.ReLU(), nn.Dropout(cfg.dropout),
            nn.Linear(cfg.hidden, cfg.classes),
        )
        self.train_loader, self.val_loader = make_loaders(cfg)
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        total_steps = cfg.epochs * len(self.train_loader)
        self.scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=total_steps)

    def _train_epoch(self):
        self.model.train()
        total = 0.0
        for x, y in self.train_loader:
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.criterion(self.model(x), y)
            loss.backward()
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
            self.optimizer.step()
            self.scheduler.step()
            total += loss.item()
        return total / len(self.train_loader)

    @torch.no_grad()
    def _evaluate(self):
        self.model.eval()
        correct, seen, loss = 0, 0, 0.0
        for x, y in self.val_loader:
            logits = self.model(x)
            loss += self.criterion(logits, y).item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
            seen += len(y)
        return loss / seen, correct / seen

    def fit(self):
        for epoch in range(self.cfg.epochs):
            train_loss = self._train_epoch()
            val_loss, val_acc = self._evaluate()
            print(f"epoch {epoch}: train {train_loss:.4f} val {val_loss:.4f} acc {val_acc:.3f} "
                  f"lr {self.scheduler.get_last_lr()[0]:.2e}")


if __name__ == "__main__":
    Trainer(Config()).fit()
