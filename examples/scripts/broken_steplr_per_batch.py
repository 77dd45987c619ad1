# nnwizard-expect: scheduler-misplaced
# nnwizard-symptom: underfitting
"""Everything inline in main(): argparse, data, model, loop. A StepLR meant to decay the learning
rate every few *epochs* is stepped after every *batch*, so the learning rate collapses to ~0
within the first epoch and the model stops learning."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--step-size", type=int, default=2, help="epochs between lr decays")
    parser.add_argument("--gamma", type=float, default=0.1)
    args = parser.parse_args()
    torch.manual_seed(0)

    g = torch.Generator().manual_seed(0)
    centers = torch.randn(5, 20, generator=g) * 1.5
    y = torch.randint(0, 5, (768,), generator=g)
    x = centers[y] + torch.randn(768, 20, generator=g)
    x = (x - x.mean(0)) / x.std(0)
    train_loader = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=32, shuffle=True)
    x_val, y_val = x[512:], y[512:]

    model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 5))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=args.step_size, gamma=args.gamma)

    for epoch in range(args.epochs):
        model.train()
        total = 0.0
        for xb, yb in train_loader:
            optimizer.zero_grad()
            loss = criterion(model(xb), yb)
            loss.backward()
            optimizer.step()
            scheduler.step()
            total += loss.item()
        model.eval()
        with torch.no_grad():
            val_acc = (model(x_val).argmax(1) == y_val).float().mean().item()
        print(f"epoch {epoch} lr {scheduler.get_last_lr()[0]:.2e} loss {total / len(train_loader):.4f} val_acc {val_acc:.3f}")


if __name__ == "__main__":
    main()
