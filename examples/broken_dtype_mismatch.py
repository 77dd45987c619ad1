"""Broken: features come from NumPy as float64 and reach float32 Linear layers unconverted; the
first matrix multiply refuses Double against Float (crash)."""

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from examples.datasets import blobs

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["dtype-mismatch"]}


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs()
    features = np.asarray(x.numpy(), dtype=np.float64)       # e.g. read with np.loadtxt
    data = TensorDataset(torch.from_numpy(features), y)
    train, val = torch.utils.data.random_split(data, [512, 256], generator=torch.Generator().manual_seed(0))
    return (torch.utils.data.DataLoader(train, batch_size=32, shuffle=True),
            torch.utils.data.DataLoader(val, batch_size=32))


loss_fn = nn.CrossEntropyLoss()
