# nnwizard-expect: lr-too-high
# nnwizard-symptom: auto
# A small next-character model over a synthetic corpus, trained with the schedule most transformer
# scripts write by hand instead of using a scheduler object: every iteration computes a warm-up then
# cosine learning rate and assigns it to each param_group itself. Weight decay is applied to matrices
# only (two parameter groups). Planted fault: the peak rate is 4e-1 where 4e-3 was meant. Nothing
# crashes and nothing turns NaN; the loss leaps in the first iterations and spends the rest of the run
# working back down to where it began.
import argparse
import math
import random

import torch
from torch import nn
import torch.nn.functional as F


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--context", type=int, default=8)
    p.add_argument("--batch", type=int, default=48)
    p.add_argument("--peak-lr", type=float, default=4e-1)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=5)
    return p.parse_args()


def make_corpus(rng):
    stems = ["tor", "vel", "an", "is", "kro", "mun", "ea", "dil", "os"]
    words = ["".join(rng.choice(stems) for _ in range(rng.randint(1, 3))) for _ in range(60)]
    return " ".join(rng.choice(words) for _ in range(4000)) + " "


class NextChar(nn.Module):
    def __init__(self, vocab, context, width=64):
        super().__init__()
        self.embed = nn.Embedding(vocab, 24)
        self.mlp = nn.Sequential(nn.Linear(24 * context, width), nn.LayerNorm(width), nn.GELU(),
                                 nn.Linear(width, width), nn.GELU())
        self.head = nn.Linear(width, vocab)

    def forward(self, idx):
        return self.head(self.mlp(self.embed(idx).flatten(1)))


def lr_at(it, args):
    if it < args.warmup:
        return args.peak_lr * (it + 1) / args.warmup
    progress = (it - args.warmup) / max(1, args.iters - args.warmup)
    return 0.1 * args.peak_lr + 0.45 * args.peak_lr * (1 + math.cos(math.pi * progress))


def main():
    args = parse()
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    corpus = make_corpus(rng)
    chars = sorted(set(corpus))
    ids = torch.tensor([chars.index(c) for c in corpus])
    train_ids, val_ids = ids[: int(0.9 * len(ids))], ids[int(0.9 * len(ids)):]

    def batch(data):
        start = torch.randint(len(data) - args.context - 1, (args.batch,))
        x = torch.stack([data[s:s + args.context] for s in start])
        return x, data[start + args.context]

    model = NextChar(len(chars), args.context)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.peak_lr, betas=(0.9, 0.99))

    for it in range(args.iters):
        lr = lr_at(it, args)
        for group in optimizer.param_groups:
            group["lr"] = lr
        xb, yb = batch(train_ids)
        loss = F.cross_entropy(model(xb), yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if it % 25 == 0:
            with torch.no_grad():
                model.eval()
                xv, yv = batch(val_ids)
                val = F.cross_entropy(model(xv), yv).item()
                model.train()
            print(f"iter {it:4d} lr {lr:.2e} loss {loss.item():.4f} val {val:.4f}")


if __name__ == "__main__":
    main()
