# nnwizard-expect: disconnected-parameters
# nnwizard-symptom: flat
# A class-based trainer for a house-price regressor. Its step wanted a "clean" float loss for logging and
# made the tensor it calls backward() on from that float: backward runs, the optimizer steps, and no
# parameter of the model ever gets a gradient.
# Planted fault: loss = torch.tensor(criterion(pred, y).item(), requires_grad=True).
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(seed=0, n=1500):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    price = (x @ torch.tensor([[1.5], [-2.0], [0.5], [0.0], [1.0], [0.3]]) + 0.3 * torch.randn(n, 1, generator=g))
    return TensorDataset(x[:1200], price[:1200]), TensorDataset(x[1200:], price[1200:])


class Trainer:
    def __init__(self, model, lr):
        self.model = model
        self.criterion = nn.MSELoss()
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def step(self, x, y):
        pred = self.model(x)
        loss = torch.tensor(self.criterion(pred, y).item(), requires_grad=True)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.item()

    @torch.no_grad()
    def validate(self, loader):
        self.model.eval()
        total = sum(self.criterion(self.model(x), y).item() * len(y) for x, y in loader)
        self.model.train()
        return total / len(loader.dataset)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    args = p.parse_args()
    torch.manual_seed(0)
    train, val = make_data()
    trainer = Trainer(nn.Sequential(nn.Linear(6, 64), nn.ReLU(), nn.Linear(64, 1)), args.lr)
    loader = DataLoader(train, batch_size=32, shuffle=True)
    for epoch in range(args.epochs):
        losses = [trainer.step(x, y) for x, y in loader]
        print(f"epoch {epoch} train {sum(losses) / len(losses):.4f} val {trainer.validate(DataLoader(val, batch_size=128)):.4f}")


if __name__ == "__main__":
    main()
