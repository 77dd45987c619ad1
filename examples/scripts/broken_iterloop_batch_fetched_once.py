# nnwizard-expect: same-batch-every-step
# nnwizard-symptom: auto
# A forecaster trained the way many single-file research scripts train: no DataLoader and no epochs, an
# iteration counter in a `while` loop, random windows cut from one long series by get_batch(split), and
# an estimate_loss() every few iterations that averages a handful of fresh batches of each split.
# Planted fault: the first batch is drawn above the loop and the loop never draws another, so every
# iteration steps on the same 32 windows. The training loss falls quickly (they are memorised); the
# estimates on fresh batches do not follow.
import math

import torch
from torch import nn
import torch.nn.functional as F

SEED = 11
LOOKBACK = 24
HORIZON = 4
BATCH = 32
MAX_ITERS = 240
EVAL_EVERY = 40
EVAL_BATCHES = 6
LR = 2e-3

torch.manual_seed(SEED)

# three overlapping daily/weekly-like cycles plus noise, 6000 readings
t = torch.arange(6000, dtype=torch.float32)
series = (torch.sin(2 * math.pi * t / 24) + 0.5 * torch.sin(2 * math.pi * t / 168)
          + 0.3 * torch.sin(2 * math.pi * t / 7.5) + 0.1 * torch.randn(6000))
series = (series - series.mean()) / series.std()
cut = int(0.85 * len(series))
splits = {"train": series[:cut], "val": series[cut:]}


def get_batch(split):
    data = splits[split]
    start = torch.randint(len(data) - LOOKBACK - HORIZON, (BATCH,))
    x = torch.stack([data[s:s + LOOKBACK] for s in start])
    y = torch.stack([data[s + LOOKBACK:s + LOOKBACK + HORIZON] for s in start])
    return x, y


class Forecaster(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(LOOKBACK, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                                 nn.Linear(64, HORIZON))

    def forward(self, x):
        return self.net(x)


model = Forecaster()
optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)


@torch.no_grad()
def estimate_loss():
    model.eval()
    out = {}
    for split in ("train", "val"):
        total = 0.0
        for _ in range(EVAL_BATCHES):
            xb, yb = get_batch(split)
            total += F.mse_loss(model(xb), yb).item()
        out[split] = total / EVAL_BATCHES
    model.train()
    return out


xb, yb = get_batch("train")
it = 0
while it < MAX_ITERS:
    if it % EVAL_EVERY == 0:
        losses = estimate_loss()
        print(f"iter {it}: train {losses['train']:.4f}, val {losses['val']:.4f}")
    pred = model(xb)
    loss = F.mse_loss(pred, yb)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if it % 20 == 0:
        print(f"iter {it}: loss {loss.item():.4f}")
    it += 1

losses = estimate_loss()
print(f"final: train {losses['train']:.4f}, val {losses['val']:.4f}")
