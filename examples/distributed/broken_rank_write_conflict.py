# nnwizard-expect: rank-write-conflict
# nnwizard-symptom: auto
"""A DistributedDataParallel text-length classifier over token ids (an Embedding bag), written as a flat
notebook export, run with `torchrun --standalone --nproc_per_node=2 broken_rank_write_conflict.py`.
Planted fault: every rank saves the checkpoint to the same `checkpoint.pt` at the end of each epoch (no
rank check), so the ranks overwrite one another's file."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if cuda else "gloo")
device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
torch.manual_seed(7)

# token sequences whose label is whether token 3 occurs more often than token 5
tokens = torch.randint(0, 20, (2400, 16))
labels = ((tokens == 3).sum(1) > (tokens == 5).sum(1)).long()
data = TensorDataset(tokens, labels)
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=48, sampler=sampler)


class BagClassifier(nn.Module):
    def __init__(self, vocab=20, dim=32):
        super().__init__()
        self.embed = nn.EmbeddingBag(vocab, dim, mode="mean")
        self.out = nn.Linear(dim, 2)

    def forward(self, ids):
        return self.out(torch.tanh(self.embed(ids)))


model = DistributedDataParallel(BagClassifier().to(device))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

for epoch in range(4):
    sampler.set_epoch(epoch)
    for ids, y in loader:
        ids, y = ids.to(device), y.to(device)
        optimizer.zero_grad()
        F.cross_entropy(model(ids), y).backward()
        optimizer.step()
    torch.save({"epoch": epoch, "model": model.module.state_dict()}, "checkpoint.pt")

dist.destroy_process_group()
