"""One run, three logs: the script's own per-step CSV, watch.jsonl and watch's TensorBoard scalars name the same
curve shape (`nnwizard curve`), non-finite steps included."""

from __future__ import annotations

import json
import math
import textwrap

import pytest

SCRIPT = textwrap.dedent("""\
    import csv
    import torch
    from torch import nn

    torch.manual_seed(0)
    X = torch.randn(512, 8)
    y = X @ torch.randn(8, 1)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with open("log.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["step", "loss"])
        for step in range(1, 81):
            if step == 30:
                for g in opt.param_groups:
                    g["lr"] = 3.0   # the rate jumps: the run diverges to inf/NaN
            i = (step * 32) % 512
            loss = nn.functional.mse_loss(model(X[i:i + 32]), y[i:i + 32])
            opt.zero_grad()
            loss.backward()
            opt.step()
            w.writerow([step, loss.item()])
""")


def test_csv_jsonl_and_tensorboard_name_the_same_shape(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from nnwizard.curves import classify, read_log
    from nnwizard.watch_cmd import run

    (tmp_path / "diverge.py").write_text(SCRIPT)
    monkeypatch.chdir(tmp_path)
    run(str(tmp_path / "diverge.py"), [], tmp_path / "w", "continue", None, tensorboard=True)
    lines = [json.loads(l) for l in (tmp_path / "w" / "watch.jsonl").read_text().splitlines()]
    logged = [l["step"] for l in lines] + [p[0] for l in lines for p in l.get("loss_between", [])]
    assert set(range(10, 71, 10)) <= set(logged)   # every 10th step, even where the lines themselves are sparser
    shapes = {}
    for name, path in (("csv", tmp_path / "log.csv"), ("jsonl", tmp_path / "w" / "watch.jsonl"),
                       ("tensorboard", tmp_path / "w" / "tensorboard")):
        curves = read_log(path)
        shapes[name] = classify(curves).shape
        if name != "csv":
            assert any(not math.isfinite(v) for v in curves.train), name   # the non-finite steps are in the log
    assert len(set(shapes.values())) == 1 and shapes["csv"] == "diverged", shapes
    tb, jl = read_log(tmp_path / "w" / "tensorboard"), read_log(tmp_path / "w" / "watch.jsonl")
    assert tb.steps == jl.steps
