# nnwizard-expect: samples-mixed-before-loss
# nnwizard-symptom: auto
# A config dict and a train_one_epoch() function on sklearn's digits (8x8 images, 10 classes), a small
# MLP that returns logits of shape (batch, classes). Planted fault: in train_one_epoch the logits are
# "put into (batch, classes) order" with reshape(NUM_CLASSES, -1).T before the loss. The shapes match
# the labels and nothing raises, but each row now holds scores of several different images.
import argparse

import torch
from torch import nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

CONFIG = {"hidden": 96, "lr": 3e-3, "batch_size": 50, "epochs": 6, "num_classes": 10}


def make_loaders(batch_size):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    train = torch.utils.data.TensorDataset(x[:1400], y[:1400])
    val = torch.utils.data.TensorDataset(x[1400:], y[1400:])
    return (torch.utils.data.DataLoader(train, batch_size=batch_size, shuffle=True, drop_last=True),
            torch.utils.data.DataLoader(val, batch_size=200))


def train_one_epoch(model, loader, optimizer, num_classes):
    model.train()
    total, count = 0.0, 0
    for images, labels in loader:
        optimizer.zero_grad()
        logits = model(images)
        logits = logits.reshape(num_classes, -1).T   # PLANTED: already (batch, classes); this mixes rows
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        total += loss.item() * len(labels)
        count += len(labels)
    return total / count


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    hits = sum((model(x).argmax(1) == y).sum().item() for x, y in loader)
    return hits / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=CONFIG["epochs"])
    args = parser.parse_args()
    torch.manual_seed(0)
    train_loader, val_loader = make_loaders(CONFIG["batch_size"])
    model = nn.Sequential(nn.Linear(64, CONFIG["hidden"]), nn.ReLU(), nn.Linear(CONFIG["hidden"], CONFIG["num_classes"]))
    optimizer = torch.optim.Adam(model.parameters(), lr=CONFIG["lr"])
    for epoch in range(args.epochs):
        loss = train_one_epoch(model, train_loader, optimizer, CONFIG["num_classes"])
        print(f"epoch {epoch}: loss {loss:.4f}  val accuracy {evaluate(model, val_loader):.3f}")


if __name__ == "__main__":
    main()
