"""Broken: the training Dataset adds random noise for augmentation from its own NumPy Generator,
created without a seed, so two runs with the same torch seed see different inputs."""

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from examples.datasets import blobs

EXPECTED = {"symptoms": ["not-reproducible"], "hypotheses": ["nondeterminism"]}


class NoisyBlobs(Dataset):
    def __init__(self, x, y, noise=0.1):
        self.x, self.y, self.noise = x, y, noise
        self.rng = np.random.default_rng()  # bug: no seed, so every run draws different noise

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        jitter = torch.from_numpy(self.rng.normal(0.0, self.noise, self.x.shape[1]).astype("float32"))
        return self.x[i] + jitter, self.y[i]


def build_model():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))


def build_data():
    x, y = blobs()
    train = DataLoader(NoisyBlobs(x[:-256], y[:-256]), batch_size=32, shuffle=True,
                       generator=torch.Generator().manual_seed(0))
    val = DataLoader(torch.utils.data.TensorDataset(x[-256:], y[-256:]), batch_size=64)
    return train, val


loss_fn = nn.CrossEntropyLoss()
