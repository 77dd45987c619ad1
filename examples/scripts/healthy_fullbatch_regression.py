# nnwizard-expect:
# nnwizard-symptom: auto
"""Healthy: full-batch regression on tensors (no DataLoader), Adam, MSE, a validation check every
few steps in eval mode under no_grad, the model put back in train mode each step."""

import argparse

import torch
from torch import nn


def make_data(n=1000, features=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = torch.tanh(x @ w / features ** 0.5) + 0.5 * x[:, :1] ** 2 + 0.1 * torch.randn(n, 1, generator=g)
    return x, (y - y.mean()) / y.std()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()
    torch.manual_seed(0)
    x, y = make_data()
    x_train, y_train, x_val, y_val = x[:750], y[:750], x[750:], y[750:]
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.MSELoss()
    for step in range(args.steps):
        model.train()
        optimizer.zero_grad()
        loss = loss_fn(model(x_train), y_train)
        loss.backward()
        optimizer.step()
        if step % 25 == 0 or step == args.steps - 1:
            model.eval()
            with torch.no_grad():
                val = loss_fn(model(x_val), y_val).item()
            print(f"step {step:4d} train mse {loss.item():.4f} val mse {val:.4f}")


if __name__ == "__main__":
    main()
