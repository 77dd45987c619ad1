"""Small synthetic data sets for the bundled examples: fast, deterministic, learnable."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset


def _generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def blobs(n: int = 768, features: int = 16, classes: int = 4, seed: int = 0, spread: float = 1.0):
    """Gaussian clusters, standardised features, integer class labels."""
    g = _generator(seed)
    centers = torch.randn(classes, features, generator=g) * 2.0
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + spread * torch.randn(n, features, generator=g)
    x = (x - x.mean(0)) / x.std(0)
    return x, y


def images(n: int = 768, classes: int = 4, size: int = 12, seed: int = 0):
    """One-channel images: each class a bright bar at its own position, plus noise."""
    g = _generator(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = 0.3 * torch.randn(n, 1, size, size, generator=g)
    band = size // classes
    for c in range(classes):
        x[y == c, 0, c * band:(c + 1) * band, :] += 1.5
    return (x - x.mean()) / x.std(), y


def regression(n: int = 768, features: int = 8, seed: int = 0, noise: float = 0.1):
    """y = a smooth nonlinear function of x, standardised, shape (n, 1)."""
    g = _generator(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = torch.tanh(x @ w) + 0.5 * x[:, :1] ** 2 + noise * torch.randn(n, 1, generator=g)
    return x, (y - y.mean()) / y.std()


def split(x, y, val: int = 256, batch_size: int = 32, shuffle: bool = True):
    """(train, val) DataLoaders from tensors: the last ``val`` samples are the validation set."""
    train = DataLoader(TensorDataset(x[:-val], y[:-val]), batch_size=batch_size, shuffle=shuffle,
                       generator=torch.Generator().manual_seed(0))
    valid = DataLoader(TensorDataset(x[-val:], y[-val:]), batch_size=batch_size, shuffle=False)
    return train, valid
