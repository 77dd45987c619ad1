# nnwizard-expect:
# nnwizard-symptom: flat
# The churn classifier of broken_binary_softmax_one_unit written right: a sigmoid on the one output unit,
# the loss logged with .item(), predictions rounded for the accuracy it prints (outside the loss).
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
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

for epoch in range(8):
    perm = torch.randperm(len(train_x))
    for i in range(0, len(train_x), 50):
        idx = perm[i:i + 50]
        probs = torch.sigmoid(model(train_x[idx]))
        loss = criterion(probs, train_y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        test_probs = torch.sigmoid(model(test_x))
        accuracy = (test_probs.round() == test_y).float().mean().item()
    model.train()
    print(f"epoch {epoch}: train loss {loss.item():.4f} test accuracy {accuracy:.4f}")
