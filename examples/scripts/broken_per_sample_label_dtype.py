# nnwizard-expect: labels-wrong-dtype
# nnwizard-symptom: crash
"""A per-sample loop (batch size 1, built by hand from Python lists, as in many tutorials): each
row is turned into a tensor, unsqueezed to a batch of one, and the loss is accumulated by hand.
Planted fault: the class id is built as a float tensor, which nn.CrossEntropyLoss rejects."""

import random

import torch
from torch import nn

random.seed(0)
torch.manual_seed(0)


def make_rows(n=200):
    rows = []
    for _ in range(n):
        label = random.randrange(3)
        features = [random.gauss(2.0 * (label == k), 1.0) for k in range(3)] + [random.gauss(0, 1) for _ in range(3)]
        rows.append((features, label))
    return rows


def main():
    rows = make_rows()
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(3):
        random.shuffle(rows)
        total = 0.0
        for features, label in rows:
            x = torch.tensor(features).unsqueeze(0)
            target = torch.tensor([label], dtype=torch.float32)
            optimizer.zero_grad()
            loss = criterion(model(x), target)
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(f"epoch {epoch}: mean loss {total / len(rows):.4f}")


if __name__ == "__main__":
    main()
