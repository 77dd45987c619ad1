"""Training modules of realistic size for ``benchmarks/scale.py`` (CONTRACT §1 namespaces).

Two families, each from about a thousand to about eleven million parameters (and, for the GPU table,
``GPU_SIZES``: a ResNet of width 128, ~45M, and a 12-layer GPT of width 768, ~85M):

- ``cnn``: a ResNet-18-style network (3x3 stem, four stages of two BasicBlocks with BatchNorm,
  global pooling, Dropout, a linear head) on 3x32x32 images, batch 64; width 64 is ResNet-18 itself.
- ``gpt``: a GPT-style decoder (token and position embeddings, pre-norm causal self-attention
  blocks with Dropout, tied-free linear head) on 64-token sequences, batch 32, next-token loss.

Each comes healthy or with one planted fault of the user's loop:

- ``zero_grad``: ``train_step`` never clears the gradients (missing-zero-grad).
- ``eval_mode``: ``evaluate`` switches the model to eval mode and nothing switches it back, so
  training after the first validation runs with Dropout off and BatchNorm frozen (train-mode-missing).

Use as ``--module benchmarks/scale_models.py:cnn_w16_healthy`` (see ``TARGETS``). The data are
synthetic but learnable within a few dozen steps (class templates under noise; a fixed token
permutation with 10% noise), so a healthy model visibly learns in a short run.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

CNN_WIDTHS = (1, 4, 16, 64)        # ~3k, ~45k, ~0.7M, ~11.2M parameters
GPT_SIZES = ((8, 1), (32, 2), (128, 4), (256, 6))   # (width, layers): ~2k, ~30k, ~0.8M, ~4.8M
GPU_SIZES = (("cnn", 128), ("gpt", (768, 12)))     # ~45M and ~85M parameters: the GPU table's (scale.py --device cuda)
FAULTS = ("healthy", "zero_grad", "eval_mode")
VOCAB, SEQ = 64, 64


# ------------------------------------------------------------------------------------------- CNN
class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.skip = nn.Sequential()
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(h)) + self.skip(x))


class ResNet(nn.Module):
    def __init__(self, width: int, classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        layers, cin = [], width
        for i, mult in enumerate((1, 2, 4, 8)):
            cout = width * mult
            layers += [Block(cin, cout, 1 if i == 0 else 2), Block(cout, cout, 1)]
            cin = cout
        self.stages = nn.Sequential(*layers)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        h = self.stages(self.stem(x))
        return self.head(self.drop(h.mean(dim=(2, 3))))


def _images(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    templates = torch.randn(10, 3, 32, 32, generator=torch.Generator().manual_seed(1234))
    y = torch.randint(0, 10, (n,), generator=g)
    x = 0.6 * templates[y] + torch.randn(n, 3, 32, 32, generator=g)
    return x, y


# ------------------------------------------------------------------------------------------- GPT
class Attention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.drop = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(SEQ, SEQ, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        att = self.drop(att.masked_fill(~self.mask[:t, :t], float("-inf")).softmax(-1))
        return self.out((att @ v).transpose(1, 2).reshape(b, t, c))


class Decoder(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float = 0.1):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = Attention(width, heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, width: int, layers: int):
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(SEQ, width)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.Sequential(*[Decoder(width, max(1, width // 32)) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB)

    def forward(self, idx):                                 # idx: (batch, time) token ids
        pos = torch.arange(idx.shape[1], device=idx.device)
        h = self.blocks(self.drop(self.tokens(idx) + self.position(pos)))
        return self.head(self.norm(h)).transpose(1, 2)      # (batch, vocab, time) for CrossEntropyLoss


def _tokens(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(4321))
    seq = torch.empty(n, SEQ + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, VOCAB, (n,), generator=g)
    for i in range(SEQ):
        noise = torch.rand(n, generator=g) < 0.1
        seq[:, i + 1] = torch.where(noise, torch.randint(0, VOCAB, (n,), generator=g), perm[seq[:, i]])
    return seq[:, :-1], seq[:, 1:]


# ------------------------------------------------------------------------------------ namespaces
def _loops(fault: str):
    def train_step(model, batch, loss_fn, optimizer):
        if fault != "eval_mode":
            model.train()
        inputs, targets = batch
        if fault != "zero_grad":
            optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
        return loss.item()

    @torch.no_grad()
    def evaluate(model, loader, loss_fn):
        model.eval()
        total, correct, count = 0.0, 0.0, 0
        for inputs, targets in loader:
            out = model(inputs)
            total += float(loss_fn(out, targets)) * len(targets)
            correct += float((out.argmax(1) == targets).float().mean()) * len(targets)
            count += len(targets)
        if fault != "eval_mode":
            model.train()
        return {"loss": total / max(count, 1), "accuracy": correct / max(count, 1)}

    return train_step, evaluate


def target(family: str, size, fault: str) -> SimpleNamespace:
    """The training module of one benchmark case."""
    if family == "cnn":
        build_model = lambda: ResNet(size)  # noqa: E731
        make, batch, lr = _images, 64, 1e-3
    else:
        width, layers = size
        build_model = lambda: GPT(width, layers)  # noqa: E731
        make, batch, lr = _tokens, 32, 3e-3

    def build_data():
        train = TensorDataset(*make(batch * 20, 0))
        val = TensorDataset(*make(batch * 4, 1))
        return DataLoader(train, batch_size=batch, shuffle=True), DataLoader(val, batch_size=batch)

    train_step, evaluate = _loops(fault)
    return SimpleNamespace(build_model=build_model, build_data=build_data, loss_fn=nn.CrossEntropyLoss(),
                           build_optimizer=lambda model: torch.optim.Adam(model.parameters(), lr=lr),
                           train_step=train_step, evaluate=evaluate, TASK="classification")


def model_name(family: str, size) -> str:
    return f"cnn_w{size}" if family == "cnn" else f"gpt_d{size[0]}_l{size[1]}"


TARGETS: dict[str, tuple] = {}
for _family, _sizes in (("cnn", CNN_WIDTHS + tuple(sz for f, sz in GPU_SIZES if f == "cnn")),
                        ("gpt", GPT_SIZES + tuple(sz for f, sz in GPU_SIZES if f == "gpt"))):
    for _size in _sizes:
        for _fault in FAULTS:
            _key = f"{model_name(_family, _size)}_{_fault}"
            TARGETS[_key] = (_family, _size, _fault)
            globals()[_key] = (lambda f=_family, s=_size, x=_fault: target(f, s, x))
