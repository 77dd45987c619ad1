"""Healthy: a GRU sequence classifier (batch_first=True, matching the (batch, time, features)
data) with gradient clipping in the user's own train_step."""

import torch
from torch import nn

from examples.datasets import split

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}


def sequences(n=768, steps=12, features=4, seed=0):
    """Class = which feature carries a bump, and whether the bump comes early or late."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.3 * torch.randn(n, steps, features, generator=g)
    channel, late = y % 2, y // 2
    for i in range(n):
        t = 2 + 6 * int(late[i])
        x[i, t:t + 3, int(channel[i])] += 1.5
    return x, y


class GRUClassifier(nn.Module):
    def __init__(self, features=4, hidden=32, classes=4):
        super().__init__()
        self.gru = nn.GRU(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        _, h = self.gru(x)          # h: (layers, batch, hidden)
        return self.head(h[-1])


def build_model():
    return GRUClassifier()


def build_data():
    return split(*sequences())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=3e-3)


def train_step(model, batch, loss_fn, optimizer):
    model.train()
    x, y = batch
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
    return loss.item()
