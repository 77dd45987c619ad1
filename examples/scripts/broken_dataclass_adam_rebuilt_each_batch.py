# nnwizard-expect: optimizer-recreated
# nnwizard-symptom: auto
# Config dataclass + train() function: a 1-D CNN classifying synthetic waveforms (sine, square,
# sawtooth) by shape, AdamW at a constant lr.
# Planted fault: the optimizer is built inside the batch loop ("fresh optimizer for each batch"),
# so AdamW's moment estimates restart at every step.
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


@dataclass
class Config:
    n: int = 1536
    length: int = 64
    batch_size: int = 32
    epochs: int = 3
    lr: float = 2e-3
    seed: int = 0


def waveforms(cfg: Config):
    g = torch.Generator().manual_seed(cfg.seed)
    kind = torch.randint(0, 3, (cfg.n,), generator=g)
    freq = 1 + 3 * torch.rand(cfg.n, 1, generator=g)
    phase = 2 * torch.pi * torch.rand(cfg.n, 1, generator=g)
    t = torch.linspace(0, 1, cfg.length).unsqueeze(0)
    arg = 2 * torch.pi * freq * t + phase
    sine, square = torch.sin(arg), torch.sign(torch.sin(arg))
    saw = 2 * ((arg / (2 * torch.pi)) % 1.0) - 1
    x = torch.where(kind[:, None] == 0, sine, torch.where(kind[:, None] == 1, square, saw))
    x = x + 0.2 * torch.randn(x.shape, generator=g)
    return TensorDataset(x.unsqueeze(1), kind)


class WaveNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv1d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool1d(2),
                                      nn.Conv1d(16, 32, 5, padding=2), nn.ReLU(), nn.AdaptiveAvgPool1d(1))
        self.classify = nn.Linear(32, 3)

    def forward(self, x):
        return self.classify(self.features(x).flatten(1))


def train(cfg: Config):
    torch.manual_seed(cfg.seed)
    data = waveforms(cfg)
    train_ds, val_ds = torch.utils.data.random_split(data, [cfg.n - 256, 256], generator=torch.Generator().manual_seed(1))
    loader = DataLoader(train_ds, batch_size=cfg.batch_size, shuffle=True)
    model = WaveNet()
    for epoch in range(cfg.epochs):
        model.train()
        for x, y in loader:
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)   # PLANTED: rebuilt every batch
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            xs, ys = zip(*[val_ds[i] for i in range(len(val_ds))])
            acc = (model(torch.stack(xs)).argmax(1) == torch.stack(ys)).float().mean().item()
        print(f"epoch {epoch}: loss {loss.item():.3f} val acc {acc:.3f}")


if __name__ == "__main__":
    train(Config())
