# nnwizard-expect: healthy
# nnwizard-symptom: auto
"""A small DistributedDataParallel classifier on synthetic clustered features, run with
`torchrun --standalone --nproc_per_node=2 healthy_ddp_classifier.py`: a DistributedSampler whose
epoch is set every epoch, validation figures summed over the ranks before rank 0 prints them, and the
checkpoint written by rank 0 alone. Nothing is wrong with it."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
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


def evaluate(model, loader, device):
    model.eval()
    totals = torch.zeros(3, device=device)   # loss sum, correct, count
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            logits = model(x)
            totals += torch.stack([F.cross_entropy(logits, y, reduction="sum"),
                                   (logits.argmax(1) == y).sum().float(), torch.tensor(float(len(y)), device=device)])
    dist.all_reduce(totals)
    model.train()
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)

    train, val = clusters(2048, seed=1), clusters(1024, seed=2)
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    val_loader = DataLoader(val, batch_size=256, sampler=DistributedSampler(val, shuffle=False))

    model = DDP(Net().to(device), device_ids=[local_rank] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
        val_loss, val_acc = evaluate(model, val_loader, device)
        if rank == 0:
            print(f"epoch {epoch}: val_loss {val_loss:.4f} val_acc {val_acc:.4f}")
            torch.save(model.module.state_dict(), "ddp_classifier.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
