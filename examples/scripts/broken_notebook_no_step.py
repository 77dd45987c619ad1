# nnwizard-expect: missing-optimizer-step
# nnwizard-symptom: flat
# A flat notebook export (no main, no functions): load_digits, an MLP, an inline epoch loop.
# Planted fault: the cell with the loop lost its optimizer.step(), so the weights never change.

# In[1]:
import torch
from torch import nn
from sklearn.datasets import load_digits

torch.manual_seed(0)

# In[2]:
digits = load_digits()
X = torch.tensor(digits.data[:1000], dtype=torch.float32) / 16.0
y = torch.tensor(digits.target[:1000], dtype=torch.long)
X_train, y_train, X_val, y_val = X[:800], y[:800], X[800:], y[800:]
train_ds = torch.utils.data.TensorDataset(X_train, y_train)
train_dl = torch.utils.data.DataLoader(train_ds, batch_size=64, shuffle=True)

# In[3]:
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

# In[4]:
history = []
for epoch in range(4):
    epoch_loss = 0.0
    for xb, yb in train_dl:
        optimizer.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        epoch_loss += loss.item() * len(xb)
    history.append(epoch_loss / len(train_ds))
    with torch.no_grad():
        model.eval()
        val_acc = (model(X_val).argmax(1) == y_val).float().mean().item()
        model.train()
    print(f"epoch {epoch}: train loss {history[-1]:.4f}  val acc {val_acc:.3f}")

# In[5]:
print("final loss", history[-1])
