"""Broken: random horizontal flips drawn from Python's global `random` module while the script
seeds only torch, so the same seed gives different augmentations and different results."""

import random

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from examples.datasets import images

EXPECTED = {"symptoms": ["not-reproducible"], "hypotheses": ["nondeterminism"]}


class FlipImages(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        image = self.x[i]
        if random.random() < 0.5:  # the global RNG: torch.manual_seed does not cover it
            image = image.flip(-1)
        return image, self.y[i]


def build_model():
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))


def build_data():
    x, y = images()
    train = DataLoader(FlipImages(x[:-256], y[:-256]), batch_size=32, shuffle=True)
    val = DataLoader(torch.utils.data.TensorDataset(x[-256:], y[-256:]), batch_size=64)
    return train, val


loss_fn = nn.CrossEntropyLoss()
