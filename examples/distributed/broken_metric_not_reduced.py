# nnwizard-expect: metric-not-reduced
# nnwizard-symptom: auto
"""A Trainer-style class around DistributedDataParallel (fit() / validate()), classifying points on two
interleaved spirals, run with `torchrun --standalone --nproc_per_node=2 broken_metric_not_reduced.py`.
Planted fault: validate() counts the correct predictions of this rank's half of the validation set only, and
rank 0 prints that as the validation accuracy (no all_reduce): the figure is rank 0's alone."""

import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def spirals(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    t = torch.rand(n, generator=g) * 3 * math.pi
    y = torch.randint(0, 2, (n,), generator=g)
    angle = t + math.pi * y
    x = torch.stack([t * torch.cos(angle), t * torch.sin(angle)], 1) / 5 + 0.1 * torch.randn(n, 2, generator=g)
    return TensorDataset(x, y)


class Trainer:
    def __init__(self, device):
        self.device = device
        self.rank = dist.get_rank()
        self.model = DistributedDataParallel(nn.Sequential(
            nn.Linear(2, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2)).to(device))
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=5e-3)
        train, val = spirals(2000, 1), spirals(600, 2)
        self.sampler = DistributedSampler(train)
        self.train_loader = DataLoader(train, batch_size=40, sampler=self.sampler)
        self.val_loader = DataLoader(val, batch_size=100, sampler=DistributedSampler(val, shuffle=False))

    def fit(self, epochs: int):
        for epoch in range(epochs):
            self.sampler.set_epoch(epoch)
            self.model.train()
            for x, y in self.train_loader:
                x, y = x.to(self.device), y.to(self.device)
                self.optimizer.zero_grad()
                loss = F.cross_entropy(self.model(x), y)
                loss.backward()
                self.optimizer.step()
            accuracy = self.validate()
            if self.rank == 0:
                print(f"epoch {epoch}  val_acc={accuracy:.4f}")

    def validate(self) -> float:
        self.model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in self.val_loader:
                x, y = x.to(self.device), y.to(self.device)
                logits = self.model(x)
                F.cross_entropy(logits, y)
                correct += (logits.argmax(1) == y).sum().item()
                total += len(y)
        return correct / total          # this rank's shard only


def main():
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(3)
    Trainer(device).fit(epochs=5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
