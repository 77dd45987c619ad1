# nnwizard-expect: missing-optimizer-step
# nnwizard-symptom: underfitting
"""Two optimizers, as in many encoder/head or GAN-style scripts: the encoder gets a small learning
rate, the head a larger one. Planted fault: both are zeroed, but only the head's optimizer is
stepped, so the encoder never moves from its random initialisation."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n=768, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 24, generator=g)
    w = torch.randn(24, 4, generator=g)
    return x, (x @ w).argmax(1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--enc-lr", type=float, default=1e-3)
    parser.add_argument("--head-lr", type=float, default=3e-3)
    args = parser.parse_args()
    torch.manual_seed(0)
    x, y = make_data()
    loader = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=32, shuffle=True)
    x_val, y_val = x[512:], y[512:]

    encoder = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU())
    head = nn.Linear(16, 4)
    enc_opt = torch.optim.Adam(encoder.parameters(), lr=args.enc_lr)
    head_opt = torch.optim.Adam(head.parameters(), lr=args.head_lr)
    criterion = nn.CrossEntropyLoss()

    for epoch in range(args.epochs):
        encoder.train(); head.train()
        for xb, yb in loader:
            enc_opt.zero_grad()
            head_opt.zero_grad()
            loss = criterion(head(encoder(xb)), yb)
            loss.backward()
            head_opt.step()
        encoder.eval(); head.eval()
        with torch.no_grad():
            acc = (head(encoder(x_val)).argmax(1) == y_val).float().mean().item()
        print(f"epoch {epoch} loss {loss.item():.4f} val acc {acc:.3f}")


if __name__ == "__main__":
    main()
