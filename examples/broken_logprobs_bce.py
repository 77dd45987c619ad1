"""Broken: the model ends in F.logsigmoid (log-probabilities, all <= 0) and the loss is BCELoss,
which needs probabilities in [0, 1]: it raises on the first batch (crash)."""

import torch.nn.functional as F
from torch import nn

from examples.datasets import blobs, split

EXPECTED = {"symptoms": ["crash"], "hypotheses": ["loss-output-mismatch"]}


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return F.logsigmoid(self.net(x)).squeeze(1)   # log p, meant for a log-likelihood


def build_model():
    return Scorer()


def build_data():
    x, y = blobs(classes=2)
    return split(x, y.float())


loss_fn = nn.BCELoss()
