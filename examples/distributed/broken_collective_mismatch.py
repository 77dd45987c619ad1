# nnwizard-expect: collective-mismatch
# nnwizard-symptom: auto
"""A DistributedDataParallel classifier whose validation runs on rank 0 only, run with `torchrun --standalone
--nproc_per_node=2 broken_collective_mismatch.py`. Planted fault: the validation helper averages its loss
with dist.all_reduce, but only rank 0 calls it: rank 0 waits in that all_reduce while rank 1 has gone on to
the next epoch's first backward (DDP's gradient all-reduce). Under plain torchrun the job hangs until the
process group's timeout."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    y = (x[:, :3].sum(1) > 0).long()
    return TensorDataset(x, y)


def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(value)
    return value / dist.get_world_size()


def validate(model, loader, device):
    model.eval()
    total = torch.zeros((), device=device)
    with torch.no_grad():
        for x, y in loader:
            total += F.cross_entropy(model(x.to(device)), y.to(device))
    model.train()
    return mean_over_ranks(total / len(loader)).item()


def main():
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)

    train_set = make_data(1600, 1)
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    val_loader = DataLoader(make_data(400, 2), batch_size=100)
    model = DDP(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(x.to(device)), y.to(device)).backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch}: val loss {validate(model.module, val_loader, device):.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
