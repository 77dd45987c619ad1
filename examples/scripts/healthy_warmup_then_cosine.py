# nnwizard-expect:
# nnwizard-symptom: auto
# The bars classifier of broken_warmup_multiplier_percent with its schedule written right: a linear
# warm-up to the configured rate over 100 steps, then a cosine decay to the end of the run, both stepped
# after every batch (SequentialLR).
import argparse

import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def bars(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.4 * torch.randn(n, 1, 12, 12, generator=g)
    for c in range(4):
        x[y == c, 0, 3 * c:3 * c + 3, :] += 1.0
    return TensorDataset(x, y)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.02)
    args = p.parse_args()
    torch.manual_seed(1)
    train = DataLoader(bars(1024, 0), batch_size=64, shuffle=True)
    test = DataLoader(bars(512, 1), batch_size=256)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(8 * 36, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    total, warmup = args.epochs * len(train), 100
    sched = torch.optim.lr_scheduler.SequentialLR(opt, [
        torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=warmup),
        torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total - warmup)], milestones=[warmup])
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
