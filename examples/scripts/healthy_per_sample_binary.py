# nnwizard-expect:
# nnwizard-symptom: auto
"""Healthy: a per-sample loop over sklearn's breast-cancer rows with gradient accumulation done
right (each sample's loss divided by the accumulation count), the usual casts between model and
loss (output .squeeze(1), label .float()), BCEWithLogitsLoss, and a held-out check."""

import torch
from sklearn.datasets import load_breast_cancer
from torch import nn

ACCUM = 16


def main():
    torch.manual_seed(0)
    data = load_breast_cancer()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target)
    order = torch.randperm(len(x))
    x, y = x[order], y[order]
    x = (x - x[:320].mean(0)) / x[:320].std(0)
    model = nn.Sequential(nn.Linear(30, 16), nn.ReLU(), nn.Linear(16, 1))
    criterion = nn.BCEWithLogitsLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    for epoch in range(3):
        model.train()
        optimizer.zero_grad()
        running = 0.0
        for seen, i in enumerate(torch.randperm(320).tolist(), start=1):
            logit = model(x[i].unsqueeze(0)).squeeze(1)
            loss = criterion(logit, y[i].unsqueeze(0).float()) / ACCUM
            loss.backward()
            running += loss.item() * ACCUM
            if seen % ACCUM == 0:
                optimizer.step()
                optimizer.zero_grad()
        model.eval()
        with torch.no_grad():
            acc = ((model(x[320:]).squeeze(1) > 0).long() == y[320:]).float().mean().item()
        print(f"epoch {epoch}: train loss {running / 320:.4f} held-out acc {acc:.3f}")


if __name__ == "__main__":
    main()
