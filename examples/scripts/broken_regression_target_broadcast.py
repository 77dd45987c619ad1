# nnwizard-expect: shape-broadcast
# nnwizard-symptom: underfitting
"""A flat regression script on sklearn's diabetes data with a hand-written epoch loop. Planted
fault: the targets arrive as (N, 1) columns and the loop "flattens" them with y.view(-1) before the
loss, while the model still returns (N, 1): mse_loss broadcasts (N, 1) against (N,) to (N, N) and
compares every prediction with every target, so the best the model can do is predict the batch mean.
The run only looks like a model that stopped improving; overfitting one batch through the script
shows it cannot even memorise 64 samples."""

import torch
import torch.nn.functional as F
from sklearn.datasets import load_diabetes
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = load_diabetes()
features = torch.tensor(data.data, dtype=torch.float32)
features = (features - features.mean(0)) / features.std(0)
targets = torch.tensor(data.target, dtype=torch.float32).unsqueeze(1)
targets = (targets - targets.mean()) / targets.std()
train = DataLoader(TensorDataset(features[:384], targets[:384]), batch_size=64, shuffle=True)

model = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

for epoch in range(10):
    total = 0.0
    for x, y in train:
        optimizer.zero_grad()
        prediction = model(x)
        loss = F.mse_loss(prediction, y.view(-1))   # the fault: y.view(-1) against a (N, 1) prediction
        loss.backward()
        optimizer.step()
        total += loss.item() * len(x)
    print(f"epoch {epoch}: train mse {total / 384:.4f}")
