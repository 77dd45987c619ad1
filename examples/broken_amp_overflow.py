"""Broken: mixed precision with fp16 autocast on weather data whose pressure column is in pascals
(~101325). fp16 tops out at 65504, so the first Linear's input becomes Inf under autocast and the
loss is NaN from the first step, although the same model trains in fp32. (Written for CUDA; the
autocast device follows the inputs, so it also reproduces with CPU fp16 autocast.)"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EXPECTED = {"symptoms": ["nan"], "hypotheses": ["amp-overflow"]}
GPU_ONLY = True


def build_data():
    g = torch.Generator().manual_seed(5)
    n = 768
    temperature = 15 + 8 * torch.randn(n, generator=g)          # deg C
    humidity = 60 + 15 * torch.randn(n, generator=g)            # percent
    pressure = 101325 + 900 * torch.randn(n, generator=g)       # Pa
    wind = 5 + 2 * torch.randn(n, generator=g).abs()            # m/s
    x = torch.stack([temperature, humidity, pressure, wind], 1)
    y = (0.3 * (temperature - 15) / 8 - 0.5 * (pressure - 101325) / 900 + 0.1 * torch.randn(n, generator=g)).unsqueeze(1)
    train = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=32, shuffle=True, generator=torch.Generator().manual_seed(0))
    val = DataLoader(TensorDataset(x[512:], y[512:]), batch_size=64)
    return train, val


def build_model():
    return nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 1))


loss_fn = nn.MSELoss()


def train_step(model, batch, loss_fn, optimizer):
    inputs, targets = batch
    model.train()
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type=inputs.device.type, dtype=torch.float16):   # no GradScaler either
        loss = loss_fn(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.item()
