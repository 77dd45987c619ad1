# nnwizard-expect: dtype-mismatch
# nnwizard-symptom: crash
# Notebook export: sklearn's diabetes regression table straight from numpy into torch.
# Planted fault: torch.from_numpy keeps numpy's float64, the model's weights are float32, and the
# first forward raises 'mat1 and mat2 must have the same dtype'.

import torch
from torch import nn
from sklearn.datasets import load_diabetes

torch.manual_seed(0)
X_np, y_np = load_diabetes(return_X_y=True)
X = torch.from_numpy((X_np - X_np.mean(0)) / X_np.std(0))
y = torch.from_numpy((y_np - y_np.mean()) / y_np.std()).view(-1, 1)
ds = torch.utils.data.TensorDataset(X[:350], y[:350])
dl = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True)

model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1))
loss_fn = nn.MSELoss()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)

for epoch in range(3):
    for xb, yb in dl:
        pred = model(xb)
        loss = loss_fn(pred, yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(epoch, loss.item())
