# nnwizard-expect: optimizer-missing-params
# nnwizard-symptom: underfitting
"""An encoder + classification head kept as two modules, trained end to end. Planted fault: the
optimizer was written for a head-only warm-up and never extended, so it only holds the head's
parameters; the encoder gets gradients on every step and never moves."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Encoder(nn.Module):
    def __init__(self, n_in=32, width=64):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(n_in, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU())

    def forward(self, x):
        return self.layers(x)


def make_data(n=768, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 32, generator=g)
    w = torch.randn(32, 4, generator=g)
    y = (x @ w).argmax(1)
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    torch.manual_seed(0)
    x, y = make_data()
    train_loader = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=32, shuffle=True)
    val_loader = DataLoader(TensorDataset(x[512:], y[512:]), batch_size=128)

    encoder = Encoder()
    head = nn.Linear(64, 4)
    optimizer = torch.optim.Adam(head.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        encoder.train(); head.train()
        for xb, yb in train_loader:
            optimizer.zero_grad()
            loss = criterion(head(encoder(xb)), yb)
            loss.backward()
            optimizer.step()
        encoder.eval(); head.eval()
        correct = 0
        with torch.no_grad():
            for xb, yb in val_loader:
                correct += (head(encoder(xb)).argmax(1) == yb).sum().item()
        print(f"epoch {epoch} last loss {loss.item():.4f} val acc {correct / 256:.3f}")


if __name__ == "__main__":
    main()
