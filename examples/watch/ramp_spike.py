"""A warm-up typed as a multiplier from 1x to 100x (meant: from 1% to 100% of the rate).

Five Gaussian classes, an MLP, SGD with momentum at 0.05 and a LambdaLR whose factor goes from 1 to 100
over 2000 steps. The loss falls to almost nothing in the first hundred steps; around step 200, with the
rate about 11x where it started and still rising, one batch's loss leaps above the recent range and the
run diverges a few steps later. The batch before that step, at the same weights, is still in range: the
replay weighs the spike as a rate problem, read against the rising rate, and names the schedule's line.

    python examples/watch/ramp_spike.py
    nnwizard watch --script examples/watch/ramp_spike.py         # watched with no code change
    nnwizard replay nnwizard-watch/anomaly-step<N>                # the first bundle
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

WARMUP = 2000


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    torch.manual_seed(0)
    centers = torch.randn(5, 20) * 1.5

    def batch(n=64):
        y = torch.randint(0, 5, (n,))
        return centers[y] + torch.randn(n, 20), y

    model = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 5))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 + 99 * min(s, WARMUP) / WARMUP)
    for step in range(args.steps):
        x, y = batch()
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 50 == 0:
            print(f"step {step} lr {scheduler.get_last_lr()[0]:.4f} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
