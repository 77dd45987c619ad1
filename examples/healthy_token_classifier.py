"""Healthy: sequences of integer token ids (categorical data) classified by a bag of embeddings; the
label says which of two marker tokens occurs more often. Near-duplicate distances between id
sequences mean nothing, so leakage is judged on exact copies only."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EXPECTED = {"symptoms": ["auto"], "hypotheses": []}
VOCAB, LENGTH = 32, 20


def _tokens(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (n, LENGTH), generator=g)
    y = ((x == 3).sum(1) > (x == 5).sum(1)).long()
    return x, y


class BagOfTokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.head = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, x):
        return self.head(self.embed(x).mean(1))


def build_model():
    return BagOfTokens()


def build_data():
    train, val = _tokens(768, 0), _tokens(256, 1)
    return (DataLoader(TensorDataset(*train), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0)),
            DataLoader(TensorDataset(*val), batch_size=64))


loss_fn = nn.CrossEntropyLoss()
