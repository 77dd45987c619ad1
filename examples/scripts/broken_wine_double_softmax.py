# nnwizard-expect: double-softmax
# nnwizard-symptom: underfitting
"""argparse + main() on sklearn's wine table; the model returns probabilities (it ends in
nn.Softmax, handy for predict_proba) and those probabilities go into nn.CrossEntropyLoss, which
applies log-softmax again: the gradients shrink and training crawls."""

import argparse

import numpy as np
import torch
from sklearn.datasets import load_wine
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def load(seed=0):
    data = load_wine()
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(data.target))
    x = data.data[order].astype(np.float32)
    y = data.target[order]
    x = (x - x[:130].mean(0)) / x[:130].std(0)
    to_t = lambda a, b: TensorDataset(torch.from_numpy(a), torch.from_numpy(b).long())
    return to_t(x[:130], y[:130]), to_t(x[130:], y[130:])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    torch.manual_seed(0)
    train_ds, val_ds = load()
    loader = DataLoader(train_ds, batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(13, 32), nn.ReLU(), nn.Linear(32, 3), nn.Softmax(dim=1))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        model.train()
        for xb, yb in loader:
            optimizer.zero_grad()
            probs = model(xb)
            loss = criterion(probs, yb)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            xv, yv = val_ds.tensors
            acc = (model(xv).argmax(1) == yv).float().mean().item()
        print(f"epoch {epoch} loss {loss.item():.4f} val acc {acc:.3f}")


if __name__ == "__main__":
    main()
