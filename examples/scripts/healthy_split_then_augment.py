# nnwizard-expect:
# nnwizard-symptom: auto
# The sensor classifier of broken_augment_then_split with the split first: validation readings are held
# out before any jittered copy is made, and only the training readings are augmented.
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
readings = torch.randn(500, 32)
state = (readings[:, :4] @ torch.randn(4, 3) + 1.2 * torch.randn(500, 3)).argmax(1)

order = torch.randperm(len(readings))
cut = int(0.8 * len(readings))
X_val, y_val = readings[order[cut:]], state[order[cut:]]
base_x, base_y = readings[order[:cut]], state[order[:cut]]
X_train = torch.cat([base_x] + [base_x + 0.02 * torch.randn_like(base_x) for _ in range(2)])
y_train = base_y.repeat(3)
shuffle = torch.randperm(len(X_train))
X_train, y_train = X_train[shuffle], y_train[shuffle]

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
