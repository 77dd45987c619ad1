# nnwizard-expect: eval-mode-missing
# nnwizard-symptom: val-suspicious
"""A class-based Trainer (fit / train_epoch / evaluate methods) for a tabular classifier with
BatchNorm and Dropout. Planted fault: Trainer.evaluate() wraps validation in no_grad but never
calls model.eval(), so Dropout keeps dropping and BatchNorm keeps updating on validation batches."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(123)) * 2
    y = torch.randint(0, 4, (n,), generator=g)
    x = centers[y] + torch.randn(n, 16, generator=g)
    return TensorDataset(x / 2.2, y)


class Classifier(nn.Module):
    def __init__(self, n_in=16, hidden=64, n_out=4, p=0.5):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(n_in, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
                                 nn.Dropout(p), nn.Linear(hidden, n_out))

    def forward(self, x):
        return self.net(x)


class Trainer:
    def __init__(self, model, train_loader, val_loader, lr=1e-3, epochs=4):
        self.model = model
        self.train_loader, self.val_loader = train_loader, val_loader
        self.criterion = nn.CrossEntropyLoss()
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.epochs = epochs
        self.history = []

    def train_epoch(self):
        self.model.train()
        total = 0.0
        for x, y in self.train_loader:
            self.optimizer.zero_grad()
            loss = self.criterion(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            total += loss.item()
        return total / len(self.train_loader)

    @torch.no_grad()
    def evaluate(self):
        total, correct, seen = 0.0, 0, 0
        for x, y in self.val_loader:
            logits = self.model(x)
            total += self.criterion(logits, y).item() * len(y)
            correct += (logits.argmax(1) == y).sum().item()
            seen += len(y)
        return total / seen, correct / seen

    def fit(self):
        for epoch in range(self.epochs):
            train_loss = self.train_epoch()
            val_loss, val_acc = self.evaluate()
            self.history.append((train_loss, val_loss, val_acc))
            print(f"[{epoch + 1}/{self.epochs}] train {train_loss:.3f} | val {val_loss:.3f} acc {val_acc:.3f}")
        return self.history


if __name__ == "__main__":
    torch.manual_seed(0)
    train_loader = DataLoader(make_blobs(512, 0), batch_size=32, shuffle=True)
    val_loader = DataLoader(make_blobs(256, 1), batch_size=32)
    Trainer(Classifier(), train_loader, val_loader).fit()
