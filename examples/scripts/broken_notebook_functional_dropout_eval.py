# nnwizard-expect: dropout-ignores-eval
# nnwizard-symptom: val-suspicious
# Notebook export (no main): sklearn's wine table standardised, a small residual MLP written as a
# class, per-epoch validation in eval mode under no_grad.
# Planted fault: forward() calls F.dropout(h, 0.3) without training=self.training, so model.eval()
# does not switch it off and every validation pass scores a randomly thinned network.

# In[1]:
import torch
from torch import nn
import torch.nn.functional as F
from sklearn.datasets import load_wine

torch.manual_seed(0)

# In[2]:
wine = load_wine()
X = torch.tensor(wine.data, dtype=torch.float32)
X = (X - X.mean(0)) / X.std(0)
y = torch.tensor(wine.target, dtype=torch.long)
order = torch.randperm(len(X), generator=torch.Generator().manual_seed(1))
X, y = X[order], y[order]
X_train, y_train, X_val, y_val = X[:140], y[:140], X[140:], y[140:]


# In[3]:
class ResidualMLP(nn.Module):
    def __init__(self, d_in, width, n_classes):
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.block = nn.Linear(width, width)
        self.head = nn.Linear(width, n_classes)

    def forward(self, x):
        h = F.relu(self.inp(x))
        h = h + F.relu(self.block(F.dropout(h, 0.3)))   # PLANTED: no training=self.training
        return self.head(h)


model = ResidualMLP(13, 64, 3)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=1e-2)

# In[4]:
for epoch in range(30):
    model.train()
    for i in range(0, len(X_train), 28):
        loss = F.cross_entropy(model(X_train[i:i + 28]), y_train[i:i + 28])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        val_loss = F.cross_entropy(model(X_val), y_val).item()
        val_acc = (model(X_val).argmax(1) == y_val).float().mean().item()
    print(f"epoch {epoch}: train {loss.item():.3f} val {val_loss:.3f} acc {val_acc:.3f}")
