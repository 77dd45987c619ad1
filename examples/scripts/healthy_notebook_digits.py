# nnwizard-expect:
# nnwizard-symptom: auto
# Healthy notebook export (no main): sklearn's digits, an MLP, OneCycleLR sized in batches and
# stepped after every batch, per-epoch validation in eval mode under no_grad, losses kept as floats.

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
train_dl = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X_train, y_train), batch_size=64, shuffle=True)

# In[3]:
EPOCHS = 4
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, epochs=EPOCHS, steps_per_epoch=len(train_dl))

# In[4]:
history = []
for epoch in range(EPOCHS):
    model.train()
    epoch_loss = 0.0
    for xb, yb in train_dl:
        optimizer.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        optimizer.step()
        scheduler.step()
        epoch_loss += loss.item() * len(xb)
    history.append(epoch_loss / len(X_train))
    model.eval()
    with torch.no_grad():
        val_acc = (model(X_val).argmax(1) == y_val).float().mean().item()
    print(f"epoch {epoch}: train loss {history[-1]:.4f}  val acc {val_acc:.3f}")
