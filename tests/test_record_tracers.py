"""record/optrace.py, record/losscalls.py, record/tracers.py: the tracers probes run around their own passes,
locating the user's line (record/frames.py)."""

from __future__ import annotations

import textwrap

import torch
from torch import nn

from nnwizard.record.losscalls import LossCalls
from nnwizard.record.optrace import OpTracer
from nnwizard.record.tracers import Reductions, anomaly_origin, trace_modules


def _user(tmp_path, source: str) -> tuple:
    path = tmp_path / "user_code.py"
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    ns: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return path, ns


def test_op_tracer_names_the_users_line_of_the_first_nonfinite_op(tmp_path):
    path, ns = _user(tmp_path, """
        import torch

        def forward(x):
            y = x * 2
            return torch.log(y - 2)
    """)
    with OpTracer(files=[path]) as trace:
        ns["forward"](torch.tensor([1.0, 2.0]))
    bad = trace.first_nonfinite
    assert bad is not None and bad.op == "log" and bad.where == f"{path.name}:6 in forward" and bad.direct
    with OpTracer(files=[path]) as healthy:
        ns["forward"](torch.tensor([3.0, 4.0]))
    assert healthy.first_nonfinite is None and [r.op for r in healthy.unsafe] == ["log"]


def test_loss_calls_see_what_reaches_the_loss_and_its_normaliser(tmp_path):
    path, ns = _user(tmp_path, """
        import torch.nn.functional as F

        def loss(out, y):
            return F.nll_loss(out.softmax(1), y)
    """)
    with LossCalls([path]) as calls:
        ns["loss"](torch.randn(4, 3), torch.tensor([0, 1, 2, 0]))
    first = calls.first
    assert first.name == "nll_loss" and first.kind == "class" and first.where == f"{path.name}:5 in loss"
    assert first.producer is not None and first.producer.op == "softmax" and first.producer.dim == 1
    with LossCalls([path]) as plain:
        nn.functional.mse_loss(torch.zeros(2), torch.ones(2))
    assert plain.first.producer is None and plain.first.where is None   # (called from no user file)


def test_reductions_catch_an_argmax_over_a_single_output():
    with Reductions() as seen:
        torch.randn(8, 1).argmax(dim=1)
        torch.randn(8, 3).argmax(dim=1)
    assert seen.single == [("argmax", [8, 1])]


def test_trace_modules_names_the_failing_layer():
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(6, 2))
    try:
        with trace_modules(model, leaves_only=True) as trace:
            model(torch.randn(3, 4))
    except RuntimeError:
        pass
    assert [c.path for c in trace.calls] == ["0", "1", "2"] and trace.failing.path == "2" and trace.failing.raised
    assert trace.calls[0].output == [3, 5]


def test_anomaly_origin_points_at_the_forward_line(tmp_path):
    path, ns = _user(tmp_path, """
        import torch

        def step(w):
            y = torch.sigmoid(w)
            y.mul_(2)
            y.sum().backward()
    """)
    where = anomaly_origin(lambda: ns["step"](torch.randn(3, requires_grad=True)), [path])
    assert where is not None and where.startswith(f"{path.name}:5 in step")
