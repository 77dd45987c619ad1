"""trace-stale-batch: a loop that fetches one batch and trains on it at every step (nanoGPT's prefetch line
deleted, ``next(iter(loader))`` before the loop, a loop variable the body never reads) is found; a loop
that draws a new batch each step, and full-batch training on one tensor, are not."""

from __future__ import annotations

from nnwizard.probes.api import ProbeContext, get

from test_script_mode import record, write   # (tests/ is on sys.path: pytest's rootdir-relative imports)

# a character model trained from random windows of one long tensor, as nanoGPT does (no DataLoader)
WINDOWS = '''
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
text = torch.randint(0, 16, (4000,))
block, batch = 16, 8


def get_batch():
    ix = torch.randint(len(text) - block - 1, (batch,))
    x = torch.stack([text[i:i + block] for i in ix])
    y = torch.stack([text[i + 1:i + 1 + block] for i in ix])
    return x, y


model = nn.Sequential(nn.Embedding(16, 32), nn.Linear(32, 16))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)


@torch.no_grad()
def estimate():
    model.eval()
    total = 0.0
    for _ in range(4):
        x, y = get_batch()
        total += F.cross_entropy(model(x).view(-1, 16), y.view(-1)).item()
    model.train()
    return total / 4


X, Y = get_batch()
step = 0
while step < 40:
    if step % 10 == 0:
        print(f"step {step} eval {estimate():.3f}")
    loss = F.cross_entropy(model(X).view(-1, 16), Y.view(-1))
    X, Y = get_batch()
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
'''

# one fixed dataset trained on as a whole at every step, evaluated on the same tensor
FULL_BATCH = '''
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
X = torch.randn(256, 4)
Y = X @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
model = nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(40):
    loss = F.mse_loss(model(X), Y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step % 10 == 0:
        with torch.no_grad():
            print(step, F.mse_loss(model(X), Y).item())
'''

# a DataLoader loop whose body uses the batch drawn before it
LOADER = '''
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 8), torch.randint(0, 3, (512,)))
loader = DataLoader(data, batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
xb, yb = next(iter(loader))
for epoch in range(2):
    for x, y in loader:
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
'''


def stale(target):
    return get("trace-stale-batch")(ProbeContext(target))


def test_a_batch_fetched_once_is_found_while_evaluation_draws_others(tmp_path):
    broken = record(write(tmp_path, ("    X, Y = get_batch()\n    opt.zero_grad()", "    opt.zero_grad()"),
                          text=WINDOWS), max_steps=30)
    result = stale(broken)
    assert result.outcome == "same-batch", result.summary
    assert result.data["eval_batches"] >= 2 and result.data["forwards"] >= 8
    assert "shape [8, 16]" in result.summary


def test_a_new_batch_every_step_is_not_flagged(tmp_path):
    result = stale(record(write(tmp_path, text=WINDOWS), max_steps=30))
    assert result.status == "passed" and result.outcome == "ok", result.summary


def test_full_batch_training_is_not_a_stale_batch(tmp_path):
    result = stale(record(write(tmp_path, text=FULL_BATCH), max_steps=30))
    assert result.status == "passed" and result.outcome == "full-batch", result.summary


def test_a_loop_body_that_ignores_the_loaders_batches_is_found(tmp_path):
    result = stale(record(write(tmp_path, text=LOADER), max_steps=30))
    assert result.outcome == "same-batch" and result.data["loader_batches"] >= 2, result.summary
    fixed = stale(record(write(tmp_path, ("model(xb), yb)", "model(x), y)"), text=LOADER, name="fixed.py"), max_steps=30))
    assert fixed.outcome == "ok", fixed.summary


# makemore's layout: an endless DataLoader (a sampler with replacement), one batch drawn per iteration of a
# `while` loop, evaluation only every few hundred steps (never reached in a short run)
ENDLESS = '''
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 8), torch.randint(0, 3, (512,)))
loader = DataLoader(data, batch_size=16, sampler=RandomSampler(data, replacement=True, num_samples=10 ** 6))
batches = iter(loader)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x, y = next(batches)
step = 0
while step < 40:
    x, y = next(batches)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
'''


def test_one_batch_drawn_from_an_endless_loader_for_every_step_is_found(tmp_path):
    broken = stale(record(write(tmp_path, ("    x, y = next(batches)\n    loss", "    loss"), text=ENDLESS), max_steps=30))
    assert broken.outcome == "same-batch" and broken.data.get("drawn_once"), broken.summary
    assert "62,500 batches" in broken.summary
    healthy = stale(record(write(tmp_path, text=ENDLESS, name="ok.py"), max_steps=30))
    assert healthy.outcome == "ok", healthy.summary
