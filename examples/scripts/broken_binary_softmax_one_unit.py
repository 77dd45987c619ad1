# nnwizard-expect: softmax-wrong-dim
# nnwizard-symptom: flat
# A churn classifier in the flat style of a notebook export: one output unit for a yes/no target, and a
# softmax over the class dimension as the multi-class version of the notebook had. With one unit the
# softmax is 1.0 for every customer, BCELoss gets the same value every step, and the loss never moves.
# Planted fault: torch.softmax(logits, dim=1) on an output of size 1 (torch.sigmoid was meant).
import torch
from torch import nn

torch.manual_seed(3)
n, features = 1200, 10
usage = torch.randn(n, features)
churned = ((usage[:, 0] - 0.8 * usage[:, 3] + 0.3 * torch.randn(n)) > 0).float().unsqueeze(1)
train_x, train_y = usage[:1000], churned[:1000]
test_x, test_y = usage[1000:], churned[1000:]

model = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Linear(32, 1))
criterion = nn.BCELoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

for epoch in range(8):
    perm = torch.randperm(len(train_x))
    for i in range(0, len(train_x), 50):
        idx = perm[i:i + 50]
        probs = torch.softmax(model(train_x[idx]), dim=1)
        loss = criterion(probs, train_y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        test_loss = criterion(torch.softmax(model(test_x), dim=1), test_y).item()
    print(f"epoch {epoch}: train loss {loss.item():.4f} test loss {test_loss:.4f}")
