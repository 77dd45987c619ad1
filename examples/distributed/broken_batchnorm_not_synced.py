# nnwizard-expect: batchnorm-not-synced
# nnwizard-symptom: auto
"""A small convolutional classifier of synthetic 16x16 patterns with BatchNorm2d after each convolution,
trained with DistributedDataParallel: `torchrun --standalone --nproc_per_node=2
broken_batchnorm_not_synced.py`. Planted fault: the global batch of 8 is split over the ranks (4 images per
rank) and the BatchNorm layers are plain ones, so each rank normalises its 4 images with their own mean and
variance (SyncBatchNorm would use all 8)."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def patterns(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    grid = torch.linspace(-1, 1, 16)
    rows, cols = torch.meshgrid(grid, grid, indexing="ij")
    bases = torch.stack([rows, cols, rows * cols])          # three oriented patterns
    x = bases[y].unsqueeze(1) * (1 + 0.3 * torch.randn(n, 1, 1, 1, generator=g)) + 0.5 * torch.randn(n, 1, 16, 16, generator=g)
    return TensorDataset(x, y)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean((2, 3)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    world = dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)

    data = patterns(1200, 1)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.global_batch // world, sampler=sampler)
    model = DDP(ConvNet().to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
