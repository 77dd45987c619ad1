# nnwizard-expect: loss-wrong-tensor
# nnwizard-symptom: underfitting
"""A per-token tagger (embedding -> linear over each position) with the usual reshaping between
model and loss: logits (B, T, C) -> .view(-1, C), tags (B, T) -> .view(-1). Planted fault: the
loss is computed against the model's own predicted tags (kept for the accuracy printout) instead
of the gold tags, so the model learns to agree with itself."""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

VOCAB, TAGS, T = 40, 5, 10


def make_corpus(n, seed):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (n, T), generator=g)
    tags = tokens % TAGS                                    # each token has a fixed tag
    return TensorDataset(tokens, tags)


class Tagger(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 32)
        self.proj = nn.Sequential(nn.ReLU(), nn.Linear(32, TAGS))

    def forward(self, tokens):
        return self.proj(self.embed(tokens))


def train(model, loader, optimizer, criterion):
    model.train()
    total, hits, count = 0.0, 0, 0
    for tokens, tags in loader:
        optimizer.zero_grad()
        logits = model(tokens)
        pred = logits.argmax(-1)
        loss = criterion(logits.view(-1, TAGS), pred.view(-1))
        loss.backward()
        optimizer.step()
        total += loss.item()
        hits += (pred == tags).sum().item()
        count += tags.numel()
    return total / len(loader), hits / count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(make_corpus(512, 0), batch_size=32, shuffle=True)
    model = Tagger()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        loss, acc = train(model, loader, optimizer, criterion)
        print(f"epoch {epoch}: loss {loss:.4f} tag accuracy {acc:.3f}")


if __name__ == "__main__":
    main()
