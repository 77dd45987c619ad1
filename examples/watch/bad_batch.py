"""A run that trains well for 300 steps, then meets a corrupt record.

Four Gaussian classes in 20 features, read by a Dataset from a table in memory; one record of the
table (number 9607, in the 301st batch of 32) was written with a missing value (NaN) by an upstream
export (``--corrupt none`` runs the clean table).

    python examples/watch/bad_batch.py                          # the plain run
    nnwizard watch --script examples/watch/bad_batch.py         # the same run, watched
    nnwizard replay nnwizard-watch/anomaly-step301              # what happened at that step
"""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

BAD_RECORD = 9607


class Records(Dataset):
    def __init__(self, n=12800, features=20, classes=4, corrupt="nan", seed=0):
        g = torch.Generator().manual_seed(seed)
        self.centers = torch.randn(classes, features, generator=g) * 2.0
        self.y = torch.randint(0, classes, (n,), generator=g)
        self.x = self.centers[self.y] + torch.randn(n, features, generator=g)
        if corrupt != "none":
            self.x[BAD_RECORD, 3] = float("nan")

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Classifier(nn.Module):
    def __init__(self, features=20, hidden=64, classes=4):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.head(self.body(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--corrupt", choices=["nan", "none"], default="nan")
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(Records(corrupt=args.corrupt), batch_size=32, shuffle=False)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    step = 0
    for epoch in range(args.epochs):
        for x, y in loader:
            logits = model(x)
            loss = criterion(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 100 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
    print(f"final loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
