# nnwizard-expect: data-not-sharded
# nnwizard-symptom: auto
"""A DistributedDataParallel regression of a smooth function of 8 features, everything inline in main(),
run with `torchrun --standalone --nproc_per_node=2 broken_data_not_sharded.py`. Planted fault: the training
DataLoader shuffles by itself (shuffle=True, no DistributedSampler), and every rank seeds the same way, so
both ranks train on the same batches: two processes do the work of one."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def main():
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{os.environ['LOCAL_RANK']}") if cuda else torch.device("cpu")
    torch.manual_seed(42)

    x = torch.rand(3000, 8) * 2 - 1
    y = (torch.sin(3 * x[:, :1]) + x[:, 1:2] * x[:, 2:3] + 0.05 * torch.randn(3000, 1))
    loader = DataLoader(TensorDataset(x, y), batch_size=50, shuffle=True)

    model = DDP(nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)).to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    loss_fn = nn.MSELoss()

    for epoch in range(5):
        total, count = torch.zeros((), device=device), 0
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = loss_fn(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(xb)
            count += len(xb)
        total /= count
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: train mse {(total / world).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
