# nnwizard-expect: lr-too-high
# nnwizard-symptom: auto
# An image classifier (small CNN on synthetic 12x12 digits of bars) with a linear warm-up built from a
# LambdaLR. The warm-up factor was typed as a percentage: it ends at 100 instead of 1.0, so after its
# 500 warm-up steps the rate is 100x the configured one. The first hundred steps train fine.
# Planted fault: WARMUP_END = 100 where 1.0 was meant.
import argparse

import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

WARMUP_STEPS = 500
WARMUP_END = 100


def bars(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.4 * torch.randn(n, 1, 12, 12, generator=g)
    for c in range(4):
        x[y == c, 0, 3 * c:3 * c + 3, :] += 1.0
    return TensorDataset(x, y)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--lr", type=float, default=0.02)
    args = p.parse_args()
    torch.manual_seed(1)
    train = DataLoader(bars(1024, 0), batch_size=64, shuffle=True)
    test = DataLoader(bars(512, 1), batch_size=256)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(8 * 36, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP_STEPS) * WARMUP_END)
    for epoch in range(args.epochs):
        model.train()
        for x, y in train:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        model.eval()
        with torch.no_grad():
            correct = sum((model(x).argmax(1) == y).sum().item() for x, y in test)
        print(f"epoch {epoch} lr {sched.get_last_lr()[0]:.4f} loss {loss.item():.4f} test acc {correct / 512:.3f}")


if __name__ == "__main__":
    main()
