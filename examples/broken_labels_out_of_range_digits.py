"""Broken: sklearn's digits with labels shifted to 1..10 for a 10-way classifier (crash)."""

import torch
from sklearn.datasets import load_digits
from torch import nn

from examples.datasets import split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["labels-out-of-range"]}


def build_model():
    return nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))


def build_data():
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long) + 1   # "class 1 is the digit 0"
    return split(x[:1200], y[:1200], val=300)


loss_fn = nn.CrossEntropyLoss()
