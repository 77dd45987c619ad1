# nnwizard-expect: metric-wrong
# nnwizard-symptom: val-suspicious
# A fraud detector with an evaluate() function in the style of a course exercise. Its accuracy counts a
# prediction right when the predicted probability equals the 0/1 label; a sigmoid never gives exactly 0
# or 1, so the printed accuracy is 0.0000 every epoch while the model does learn.
# Planted fault: correct += (probs == labels).sum().item() (meant: (probs > 0.5).float() == labels).
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def load(seed=0, n=2000):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g)
    fraud = ((x[:, 1] + x[:, 4] - x[:, 7] + 0.5 * torch.randn(n, generator=g)) > 1.0).float()
    return TensorDataset(x[:1600], fraud[:1600]), TensorDataset(x[1600:], fraud[1600:])


def evaluate(model, loader):
    model.eval()
    correct, total = 0, 0
    with torch.no_grad():
        for x, labels in loader:
            probs = torch.sigmoid(model(x)).squeeze(1)
            correct += (probs == labels).sum().item()
            total += labels.size(0)
    model.train()
    return correct / total


def main():
    torch.manual_seed(0)
    train, val = load()
    train_loader = DataLoader(train, batch_size=64, shuffle=True)
    val_loader = DataLoader(val, batch_size=100)
    model = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 1))
    criterion = nn.BCEWithLogitsLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(6):
        for x, labels in train_loader:
            loss = criterion(model(x).squeeze(1), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"Epoch {epoch + 1}: loss {loss.item():.4f}, validation accuracy {evaluate(model, val_loader):.4f}")


if __name__ == "__main__":
    main()
