# nnwizard-expect: ranks-diverged
# nnwizard-symptom: auto
"""A pytorch/examples-style script (argparse, main(), train()) fitting a small MLP to 10-class synthetic
clusters, run with `torchrun --standalone --nproc_per_node=2 broken_ranks_diverged.py`. Planted fault: the
model is wrapped in DistributedDataParallel, but train() calls the module it wraps (`net`), not the wrapper,
so DDP never averages the gradients and each rank's replica drifts on its own data."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def train(args, net, loader, optimizer, epoch, device):
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(net(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % args.log_interval == 0 and dist.get_rank() == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.sampler)}]\tLoss: {loss.item():.6f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--log-interval", type=int, default=10)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(1)

    centers = torch.randn(10, 16) * 2
    y = torch.randint(0, 10, (2560,))
    data = TensorDataset(centers[y] + torch.randn(2560, 16), y)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)

    net = Net().to(device)
    model = DistributedDataParallel(net, device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        train(args, net, loader, optimizer, epoch, device)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
