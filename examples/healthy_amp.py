"""Healthy: mixed precision with autocast and GradScaler (float16 on CUDA; bfloat16 autocast and a
disabled scaler on CPU, where float16 gradients need no scaling)."""

import torch
from torch import nn

from examples.datasets import images, split

EXPECTED = {"symptoms": ["flat"], "hypotheses": []}
scaler = torch.amp.GradScaler("cuda", enabled=torch.cuda.is_available())


def build_model():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 6 * 6, 4),
    )


def build_data():
    return split(*images())


loss_fn = nn.CrossEntropyLoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=3e-3)


def train_step(model, batch, loss_fn, optimizer):
    model.train()
    x, y = batch
    device = x.device.type
    dtype = torch.float16 if device == "cuda" else torch.bfloat16
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=device, dtype=dtype):
        loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return loss.item()


def evaluate(model, loader, loss_fn):
    model.eval()
    total, correct, n = 0.0, 0, 0
    with torch.inference_mode():
        for x, y in loader:
            out = model(x)
            total += loss_fn(out, y).item() * len(y)
            correct += (out.argmax(1) == y).sum().item()
            n += len(y)
    model.train()
    return {"loss": total / n, "accuracy": correct / n}
