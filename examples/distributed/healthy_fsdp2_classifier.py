# nnwizard-expect: healthy
# nnwizard-symptom: auto
"""The same kind of classifier sharded with FSDP2 (`torch.distributed.fsdp.fully_shard`): every Linear
layer and then the whole model become FSDP modules whose parameters are DTensors sharded over the
ranks. Run with `torchrun --standalone --nproc_per_node=2 healthy_fsdp2_classifier.py`. Nothing is
wrong with it."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def clusters(n: int, seed: int, features: int = 20, classes: int = 4) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    centers = torch.randn(classes, features, generator=g) * 1.5
    g.manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    x = centers[y] + torch.randn(n, features, generator=g)
    return TensorDataset(x, y)


class Net(nn.Module):
    def __init__(self, features: int = 20, hidden: int = 64, classes: int = 4):
        super().__init__()
        self.fc1 = nn.Linear(features, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x):
        return self.out(F.relu(self.fc2(F.relu(self.fc1(x)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    train = clusters(2048, seed=1)
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    model = Net().to(device)
    for layer in (model.fc1, model.fc2, model.out):
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(y), torch.tensor(float(len(y)), device=device)])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: train_loss {(total[0] / total[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
