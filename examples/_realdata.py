"""Real data sets that ship inside scikit-learn (no download at run time), as (train, val) loaders.

Each loader shuffles the rows once with a fixed permutation (several of these files are sorted by
class), holds out a validation share, and standardises the features with statistics of the training
part only, as a careful user would.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset


def _tensors(bunch, seed: int = 0):
    x = torch.as_tensor(bunch.data, dtype=torch.float32)
    y = torch.as_tensor(bunch.target)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    return x[order], y[order]


def loaders(x, y, val_fraction: float = 0.25, batch_size: int = 32, standardise: bool = True):
    """(train, val) DataLoaders; features standardised with the training split's mean and std."""
    n_val = max(1, int(len(x) * val_fraction))
    x_train, y_train, x_val, y_val = x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:]
    if standardise:
        mean, std = x_train.mean(0), x_train.std(0)
        std = torch.where(std > 1e-6, std, torch.ones_like(std))  # constant columns (digits' corner pixels) stay as they are
        x_train, x_val = (x_train - mean) / std, (x_val - mean) / std
    train = DataLoader(TensorDataset(x_train, y_train), batch_size=batch_size, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(TensorDataset(x_val, y_val), batch_size=batch_size, shuffle=False)
    return train, val


def digits(n: int = 1000):
    """8x8 handwritten digits flattened to 64 features, labels 0..9 (int64); the first ``n`` of the
    1,797 images after the fixed shuffle, to keep the examples fast."""
    from sklearn.datasets import load_digits

    x, y = _tensors(load_digits())
    return x[:n], y[:n].long()


def wine():
    """178 wines, 13 chemical measurements, 3 cultivars (labels 0..2, int64)."""
    from sklearn.datasets import load_wine

    x, y = _tensors(load_wine())
    return x, y.long()


def breast_cancer():
    """569 tumours, 30 features, binary target as float32 of shape (n, 1)."""
    from sklearn.datasets import load_breast_cancer

    x, y = _tensors(load_breast_cancer())
    return x, y.float().unsqueeze(1)


def diabetes():
    """442 patients, 10 (already scaled) features, disease progression standardised, shape (n, 1)."""
    from sklearn.datasets import load_diabetes

    x, y = _tensors(load_diabetes())
    y = y.float().unsqueeze(1)
    return x, (y - y.mean()) / y.std()


def sequences(n: int = 640, steps: int = 12, features: int = 4, classes: int = 4, seed: int = 0):
    """(n, steps, features) sequences, batch first: a pulse in feature 0 whose timing is the class."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = 0.3 * torch.randn(n, steps, features, generator=g)
    span = steps // classes
    for c in range(classes):
        x[y == c, c * span:(c + 1) * span, 0] += 1.5
    return x, y
