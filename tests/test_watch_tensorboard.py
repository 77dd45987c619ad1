"""Watch mode's TensorBoard scalars (written when ``tensorboard`` is installed; the dev extra installs it)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import nnwizard


def test_watch_writes_the_logged_steps_as_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    X, Y = torch.randn(400, 6), torch.randn(400, 1)
    with nnwizard.watch(model, opt, out=tmp_path / "w", every=10, quiet=True):
        for i in range(40):
            loss = nn.functional.mse_loss(model(X[i * 10:(i + 1) * 10]), Y[i * 10:(i + 1) * 10])
            opt.zero_grad()
            loss.backward()
            opt.step()
    logged = [json.loads(line) for line in (tmp_path / "w" / "watch.jsonl").read_text().splitlines()]
    events = EventAccumulator(str(tmp_path / "w" / "tensorboard"))
    events.Reload()
    loss_events = events.Scalars("nnwizard/loss")
    assert [e.step for e in loss_events] == [line["step"] for line in logged]
    assert [round(e.value, 5) for e in loss_events] == [round(line["loss"], 5) for line in logged]
    assert {"nnwizard/grad_norm", "nnwizard/lr"} <= set(events.Tags()["scalars"])


def test_no_tensorboard_folder_when_it_is_turned_off(tmp_path):
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with nnwizard.watch(model, opt, out=tmp_path / "w", tensorboard=False, quiet=True):
        for _ in range(3):
            loss = model(torch.randn(4, 3)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert (tmp_path / "w" / "watch.jsonl").exists() and not (tmp_path / "w" / "tensorboard").exists()
