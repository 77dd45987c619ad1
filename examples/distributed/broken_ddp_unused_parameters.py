# nnwizard-expect: disconnected-parameters
# nnwizard-symptom: crash
"""A DistributedDataParallel model with a main head and an auxiliary head kept from an earlier experiment,
run with `torchrun --standalone --nproc_per_node=2 broken_ddp_unused_parameters.py`. Planted fault: the
forward never uses the auxiliary head, and DistributedDataParallel is built with find_unused_parameters=False
(the default): its reducer waits for gradients of the auxiliary head that never come, and the second
iteration raises on every rank."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 32), nn.ReLU())
        self.head = nn.Linear(32, 3)
        self.aux_head = nn.Linear(32, 1)      # no longer used by forward()

    def forward(self, x):
        return self.head(self.body(x))


def main():
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    x = torch.randn(960, 6)
    y = torch.bucketize(x[:, 0] + x[:, 1], torch.tensor([-0.5, 0.5]))
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=24, sampler=sampler)
    model = DistributedDataParallel(TwoHeads().to(device))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(xb.to(device)), yb.to(device)).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
