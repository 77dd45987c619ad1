# nnwizard-expect:
# nnwizard-symptom: val-suspicious
# The fraud detector of broken_accuracy_probabilities_vs_labels counting right predictions by the 0.5
# threshold, its accuracy printed as a percentage ("87.50%") and a correct-of-total count.
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
            predicted = (torch.sigmoid(model(x)).squeeze(1) > 0.5).float()
            correct += (predicted == labels).sum().item()
            total += labels.size(0)
    model.train()
    return correct, total


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
        correct, total = evaluate(model, val_loader)
        print(f"Epoch {epoch + 1}: loss {loss.item():.4f}, validation accuracy {100 * correct / total:.2f}% ({correct}/{total})")


if __name__ == "__main__":
    main()
