# nnwizard-expect: target-shape-mismatch
# nnwizard-symptom: crash
"""Full-batch training on tensors built from numpy arrays. Planted fault: the labels were kept as a
column vector, shape (N, 1) (reshape(-1, 1) as for scikit-learn), and reach nn.CrossEntropyLoss
that way: it raises '0D or 1D target tensor expected, multi-target not supported'."""

import numpy as np
import torch
from torch import nn


def main():
    rng = np.random.default_rng(0)
    n, d, k = 400, 10, 3
    centers = rng.normal(size=(k, d)) * 2
    labels = rng.integers(0, k, size=n)
    x = (centers[labels] + rng.normal(size=(n, d))).astype(np.float32)
    y = labels.reshape(-1, 1)
    X = torch.from_numpy(x)
    Y = torch.from_numpy(y)
    model = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, k))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for it in range(100):
        optimizer.zero_grad()
        loss = criterion(model(X), Y)
        loss.backward()
        optimizer.step()
        if it % 20 == 0:
            print(f"iter {it} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
