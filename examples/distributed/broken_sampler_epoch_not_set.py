# nnwizard-expect: sampler-epoch-not-set
# nnwizard-symptom: auto
"""A DistributedDataParallel classifier of tabular records (argparse, a train()/evaluate() pair), run with
`torchrun --standalone --nproc_per_node=2 broken_sampler_epoch_not_set.py`. Planted fault: the training
DistributedSampler shuffles, but `set_epoch` is never called, so every epoch draws the very same order on
every rank."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def records(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g)
    w = torch.linspace(-1, 1, 12)
    y = ((x @ w + 0.3 * x[:, 0] * x[:, 1]) > 0).long()
    return TensorDataset(x, y)


def train(model, loader, optimizer, device):
    model.train()
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()


def evaluate(model, loader, device):
    model.eval()
    stats = torch.zeros(2, device=device)
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            stats += torch.stack([(model(x).argmax(1) == y).sum().float(), torch.tensor(float(len(y)), device=device)])
    dist.all_reduce(stats)
    return (stats[0] / stats[1]).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)

    train_set, val_set = records(2048, 1), records(512, 2)
    train_sampler = DistributedSampler(train_set, shuffle=True)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    val_loader = DataLoader(val_set, batch_size=128, sampler=DistributedSampler(val_set, shuffle=False))

    model = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Linear(48, 2)).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    for epoch in range(args.epochs):
        train(model, train_loader, optimizer, device)          # (the sampler's epoch is never set)
        acc = evaluate(model, val_loader, device)
        if rank == 0:
            print(f"epoch {epoch} val accuracy {acc:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
