"""Broken: a deep residual MLP whose blocks have no normalisation, trained with plain SGD and no
gradient clipping. Each unnormalised block doubles the activation variance, so the gradient norm at
initialisation is already in the thousands; one SGD step throws the weights far away and the loss
turns Inf/NaN. A smaller learning rate only delays it; clipping the gradient norm keeps it finite."""

import torch
from torch import nn

from examples.datasets import regression, split

EXPECTED = {"symptoms": ["nan"], "hypotheses": ["exploding-gradients"]}


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU()
        nn.init.kaiming_normal_(self.fc.weight, nonlinearity="relu")

    def forward(self, x):
        return x + self.act(self.fc(x))     # no LayerNorm, no 1/sqrt(depth) scaling on the branch


class DeepResMLP(nn.Module):
    def __init__(self, width=64, depth=12):
        super().__init__()
        self.inp = nn.Linear(8, width)
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.out = nn.Linear(width, 1)

    def forward(self, x):
        return self.out(self.blocks(self.inp(x)))


def build_data():
    return split(*regression(seed=2))


def build_model():
    return DeepResMLP()


loss_fn = nn.MSELoss()


def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.01)
