# nnwizard-expect: clip-misplaced
# nnwizard-symptom: auto
# Sensor forecasting with a GRU: windows of a noisy multi-sine signal, predict the next value.
# argparse, a fit() function with a per-epoch validation pass in eval mode under no_grad.
# Planted fault: the gradient clipping (max_norm 1.0, "RNNs need it") is called after
# optimizer.step(), so it trims gradients the step has already applied; no step is ever clipped.
import argparse

import torch
from torch import nn


def make_windows(n, length, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n + length + 1, dtype=torch.float32)
    signal = torch.sin(t / 7.0) + 0.5 * torch.sin(t / 3.1 + 1.0) + 0.1 * torch.randn(t.shape, generator=g)
    idx = torch.arange(n).unsqueeze(1) + torch.arange(length + 1)
    windows = signal[idx]
    return windows[:, :-1].unsqueeze(-1), windows[:, -1:]


class Forecaster(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.gru = nn.GRU(1, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        seq, _ = self.gru(x)
        return self.out(seq[:, -1])


def fit(model, train, val, epochs, lr, batch):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    x_train, y_train = train
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(x_train))
        for i in range(0, len(order), batch):
            j = order[i:i + batch]
            loss = nn.functional.mse_loss(model(x_train[j]), y_train[j])
            opt.zero_grad()
            loss.backward()
            opt.step()
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)   # PLANTED: after the step
        model.eval()
        with torch.no_grad():
            val_loss = nn.functional.mse_loss(model(val[0]), val[1]).item()
        print(f"epoch {epoch}: train {loss.item():.4f} val {val_loss:.4f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--hidden", type=int, default=32)
    args = p.parse_args()
    torch.manual_seed(0)
    train, val = make_windows(1024, 24, seed=1), make_windows(256, 24, seed=2)
    fit(Forecaster(args.hidden), train, val, args.epochs, args.lr, batch=32)


if __name__ == "__main__":
    main()
