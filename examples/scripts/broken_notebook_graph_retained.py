# nnwizard-expect: graph-retained
# nnwizard-symptom: auto
# Exported from a notebook: a binary classifier on sklearn's breast-cancer table.
# Planted fault: the running loss adds up the loss *tensors* (running_loss += loss), not
# loss.item(), so each step's autograd graph stays chained to the total and memory grows every step.

import torch
import torch.nn as nn
from sklearn.datasets import load_breast_cancer

torch.manual_seed(0)
data = load_breast_cancer()
features = torch.tensor(data.data, dtype=torch.float32)
labels = torch.tensor(data.target, dtype=torch.float32)
perm = torch.randperm(len(features))
features, labels = features[perm], labels[perm]
features = (features - features.mean(0)) / features.std(0)
dataset = torch.utils.data.TensorDataset(features[:450], labels[:450])
loader = torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True)

net = nn.Sequential(nn.Linear(30, 32), nn.ReLU(), nn.Linear(32, 1))
loss_func = nn.BCEWithLogitsLoss()
opt = torch.optim.Adam(net.parameters(), lr=1e-3)

for epoch in range(4):
    running_loss = 0
    for xb, yb in loader:
        opt.zero_grad()
        out = net(xb).squeeze(1)
        loss = loss_func(out, yb)
        loss.backward()
        opt.step()
        running_loss += loss
    print("epoch", epoch, "loss", float(running_loss / len(loader)))

with torch.no_grad():
    net.eval()
    acc = ((net(features[450:]).squeeze(1) > 0).float() == labels[450:]).float().mean()
print("held-out accuracy", acc.item())
