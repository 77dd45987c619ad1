# nnwizard-expect: zero-grad-misplaced
# nnwizard-symptom: flat
# A small Trainer class (fit / _train_one / evaluate) on sklearn's breast-cancer table, SGD with momentum.
# Planted fault: in _train_one the gradients are cleared between loss.backward() and optimizer.step()
# ("tidy up before stepping"), so every step finds them gone and the weights never move.
import torch
from torch import nn
from sklearn.datasets import load_breast_cancer


class Trainer:
    def __init__(self, model, lr=0.05, epochs=5, batch_size=32):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        self.criterion = nn.BCEWithLogitsLoss()
        self.epochs, self.batch_size = epochs, batch_size

    def _train_one(self, xb, yb):
        self.model.train()
        loss = self.criterion(self.model(xb).squeeze(1), yb)
        loss.backward()
        self.optimizer.zero_grad()   # PLANTED: between backward() and step()
        self.optimizer.step()
        return loss.item()

    def evaluate(self, x, y):
        self.model.eval()
        with torch.no_grad():
            return ((self.model(x).squeeze(1) > 0).float() == y).float().mean().item()

    def fit(self, x, y, x_val, y_val):
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=self.batch_size,
                                             shuffle=True)
        for epoch in range(self.epochs):
            losses = [self._train_one(xb, yb) for xb, yb in loader]
            print(f"epoch {epoch}: loss {sum(losses) / len(losses):.4f}  val acc {self.evaluate(x_val, y_val):.3f}")


def main():
    torch.manual_seed(0)
    data = load_breast_cancer()
    x = torch.tensor(data.data, dtype=torch.float32)
    x = (x - x.mean(0)) / x.std(0)
    y = torch.tensor(data.target, dtype=torch.float32)
    model = nn.Sequential(nn.Linear(30, 32), nn.ReLU(), nn.Linear(32, 1))
    Trainer(model).fit(x[:450], y[:450], x[450:], y[450:])


if __name__ == "__main__":
    main()
