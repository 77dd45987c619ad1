# nnwizard-expect: disconnected-parameters
# nnwizard-symptom: crash
# A pairwise ranking model: each query scores its candidate documents one at a time, and the scores of a
# query are gathered with torch.tensor(list) as one would gather Python numbers. The script raises
# "only one element tensors can be converted to Python scalars"; with one document per call it would
# run, with the scores copied out of the graph.
# Planted fault: torch.tensor(scores) where torch.stack(scores) was meant.
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
dim, docs = 16, 5
queries = torch.randn(400, dim)
documents = torch.randn(400, docs, dim)
relevant = (documents * queries[:, None]).sum(-1).argmax(1)   # the document most aligned with the query


class Scorer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(dim, 32)
        self.d = nn.Linear(dim, 32)

    def forward(self, q, d):
        return (self.q(q) * self.d(d)).sum(-1)


model = Scorer()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(3):
    for i in range(0, 400, 20):
        q, d, target = queries[i:i + 20], documents[i:i + 20], relevant[i:i + 20]
        scores = [model(q, d[:, k]) for k in range(docs)]      # docs tensors of shape (20,)
        logits = torch.tensor(scores).t()
        loss = F.cross_entropy(logits, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(epoch, loss.item())
