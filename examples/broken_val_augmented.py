"""Broken: one Dataset class with random augmentation serves training AND validation: the validation
images change every time they are read, so validation scores are noisy and pessimistic."""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from examples.datasets import images

EXPECTED = {"symptoms": ["val-suspicious"], "hypotheses": ["val-augmented"]}


class Bars(Dataset):
    def __init__(self, x, y, augment=True):
        self.x, self.y, self.augment = x, y, augment

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        x = self.x[i]
        if self.augment:
            if torch.rand(()) < 0.5:
                x = x.flip(-1)
            x = x + 0.3 * torch.randn_like(x)
        return x, self.y[i]


def build_model():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 6 * 6, 4),
    )


def build_data():
    x, y = images()
    train = Bars(x[:-256], y[:-256])
    val = Bars(x[-256:], y[-256:])            # meant: Bars(..., augment=False)
    return (DataLoader(train, batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)),
            DataLoader(val, batch_size=32, shuffle=False))


loss_fn = nn.CrossEntropyLoss()
