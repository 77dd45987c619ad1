"""Broken: the classifier head was sized for 'same' padding, but the conv has none (crash)."""

from torch import nn

from examples.datasets import images, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["layer-shape-mismatch"]}


def build_model():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2),   # 12x12 -> 10x10 -> 5x5, not 6x6
        nn.Flatten(), nn.Linear(8 * 6 * 6, 4),
    )


def build_data():
    return split(*images())


loss_fn = nn.CrossEntropyLoss()
