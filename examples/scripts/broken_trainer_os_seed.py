# nnwizard-expect: nondeterminism
# nnwizard-symptom: not-reproducible
"""A class-based trainer on sklearn's breast-cancer data, with a --seed option. Planted fault: when
no --seed is given the trainer "picks one" from the operating system (random.SystemRandom), so every run starts from different
weights and batch orders, whatever the caller seeded before. The loop itself is clean; only running
the script again, with and without a seed from outside, shows that nothing outside it can make two
runs agree."""

import argparse
import random

import torch
from sklearn.datasets import load_breast_cancer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, seed=None, epochs=3, lr=1e-3):
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        torch.manual_seed(self.seed)
        data = load_breast_cancer()
        x = torch.tensor(data.data, dtype=torch.float32)
        x = (x - x.mean(0)) / x.std(0)
        y = torch.tensor(data.target, dtype=torch.float32)
        self.loader = DataLoader(TensorDataset(x[:480], y[:480]), batch_size=32, shuffle=True)
        self.model = nn.Sequential(nn.Linear(30, 32), nn.ReLU(), nn.Linear(32, 1))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.criterion = nn.BCEWithLogitsLoss()
        self.epochs = epochs

    def fit(self):
        print(f"training with seed {self.seed}")
        for epoch in range(self.epochs):
            self.model.train()
            running = 0.0
            for x, y in self.loader:
                self.optimizer.zero_grad()
                loss = self.criterion(self.model(x).squeeze(1), y)
                loss.backward()
                self.optimizer.step()
                running += loss.item()
            print(f"epoch {epoch}: loss {running / len(self.loader):.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    Trainer(args.seed, args.epochs).fit()
