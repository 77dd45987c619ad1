"""A learning-rate warmup written wrong: it ramps to 100x the intended peak.

The intent: warm up linearly from 0 to PEAK_LR = 0.01 over 2000 steps, then hold. The schedule
multiplies by ``WARMUP_PEAK = 100`` ("100 %") instead of 1.0, so the LR passes the intended peak at step 20
and keeps rising to 1.0. SGD with momentum copes for a while, then the loss leaves its range.

    python examples/watch/warmup.py
    python examples/watch/warmup.py --watch nnwizard-watch     # the same loop inside nnwizard.watch
    nnwizard watch --script examples/watch/warmup.py            # or watched with no code change
"""

import argparse
import contextlib

import torch
from torch import nn

PEAK_LR = 0.01
WARMUP_STEPS = 2000
WARMUP_PEAK = 100  # meant as "100 %" of PEAK_LR: the factor should be 1.0


def warmup(step):
    return min(step / WARMUP_STEPS, 1.0) * WARMUP_PEAK


def make_data(n=16000, features=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, 1, generator=g)
    y = torch.tanh(x @ w / 4) * 3 + 0.1 * torch.randn(n, 1, generator=g)
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--watch", default=None, help="run the loop inside nnwizard.watch(out=DIR)")
    args = parser.parse_args()
    torch.manual_seed(0)
    x, y = make_data()
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=PEAK_LR, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
    loss_fn = nn.MSELoss()
    if args.watch:
        import nnwizard

        guard = nnwizard.watch(model, optimizer, out=args.watch)
    else:
        guard = contextlib.nullcontext()
    with guard:
        for step in range(args.steps):
            i = (step * 32) % len(x)
            pred = model(x[i:i + 32])
            loss = loss_fn(pred, y[i:i + 32])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            if step % 50 == 0:
                print(f"step {step} lr {scheduler.get_last_lr()[0]:.4g} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
