# nnwizard-expect: layer-shape-mismatch
# nnwizard-symptom: crash
"""A config dataclass and a small CNN whose classifier was sized for 28x28 inputs (copied from an
MNIST model) while the data are 16x16 images: the first forward raises in the Linear layer
('mat1 and mat2 shapes cannot be multiplied')."""

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class TrainConfig:
    image_size: int = 16
    channels: list = field(default_factory=lambda: [8, 16])
    classes: int = 4
    batch_size: int = 32
    epochs: int = 2
    lr: float = 1e-3


class SmallCNN(nn.Module):
    def __init__(self, cfg: TrainConfig):
        super().__init__()
        c1, c2 = cfg.channels
        self.features = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(c2 * 7 * 7, 64), nn.ReLU(), nn.Linear(64, cfg.classes))

    def forward(self, x):
        return self.classifier(self.features(x))


def make_loader(cfg: TrainConfig, n=256):
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, cfg.classes, (n,), generator=g)
    x = 0.3 * torch.randn(n, 1, cfg.image_size, cfg.image_size, generator=g)
    for c in range(cfg.classes):
        x[y == c, 0, :, 4 * c:4 * c + 4] += 1.0
    return DataLoader(TensorDataset(x, y), batch_size=cfg.batch_size, shuffle=True)


def train(cfg: TrainConfig):
    torch.manual_seed(0)
    model = SmallCNN(cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    criterion = nn.CrossEntropyLoss()
    loader = make_loader(cfg)
    for epoch in range(cfg.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")


if __name__ == "__main__":
    train(TrainConfig())
