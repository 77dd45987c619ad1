# nnwizard-expect: labels-out-of-range
# nnwizard-symptom: crash
"""pytorch/examples style on sklearn's 8x8 digits. Planted fault: the labels are shifted to 1..10
("0 is reserved for padding") but the classifier still has 10 outputs, so the first batch that
holds a 9 (now 10) makes cross_entropy raise 'Target 10 is out of bounds'."""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % 10 == 0:
            print(f"epoch {epoch} batch {batch_idx} loss {loss.item():.4f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    torch.manual_seed(0)
    digits = load_digits()
    x = torch.tensor(digits.data[:800], dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target[:800]) + 1
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    device = torch.device("cpu")
    model = MLP().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, loader, optimizer, epoch)


if __name__ == "__main__":
    main()
