# nnwizard-expect: train-val-leakage
# nnwizard-symptom: auto
# Sensor readings classified into machine states. The notebook "augments" the table with jittered copies
# of every reading to triple it, then holds out 20% at random as validation: most validation readings have
# a jittered twin in the training set, and validation accuracy reports memory.
# Planted fault: augmentation applied to the whole table before the train/validation split.
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
readings = torch.randn(500, 32)
state = (readings[:, :4] @ torch.randn(4, 3) + 1.2 * torch.randn(500, 3)).argmax(1)

jittered = [readings + 0.02 * torch.randn_like(readings) for _ in range(2)]
X = torch.cat([readings] + jittered)
y = state.repeat(3)
order = torch.randperm(len(X))
cut = int(0.8 * len(X))
X_train, y_train = X[order[:cut]], y[order[:cut]]
X_val, y_val = X[order[cut:]], y[order[cut:]]

model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 3))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(25):
    model.train()
    for i in range(0, len(X_train), 64):
        loss = F.cross_entropy(model(X_train[i:i + 64]), y_train[i:i + 64])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        val_acc = (model(X_val).argmax(1) == y_val).float().mean().item()
    print(f"epoch {epoch} loss {loss.item():.3f} val acc {val_acc:.3f}")
