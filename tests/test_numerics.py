"""NaN/Inf probes: each fires on its broken example and stays quiet on a healthy one, the op tracer
names the right op and line, and the scripted diagnoses put the right hypothesis first."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import cuda, diagnose_example, load_example, run_probe_on


@pytest.fixture(scope="module")
def healthy():
    return load_example("healthy_mlp")


def test_optracer_finds_first_nonfinite_op_and_backward():
    from nnwizard.record.optrace import OpTracer

    torch.manual_seed(0)  # the weights and inputs decide whether sigmoid saturates to exactly 1
    model = nn.Sequential(nn.Linear(4, 3), nn.Sigmoid())
    x, y = torch.randn(5, 4) * 40, torch.ones(5, 3)
    with OpTracer(model, backward=True) as trace:
        p = model(x)
        loss = -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()
        loss.backward()
    bad = trace.first_nonfinite
    assert bad is not None and bad.op == "log" and bad.phase == "loss" and bad.min_abs == 0.0
    assert bad.where and "test_numerics.py" in bad.where
    assert any(r.op == "sigmoid" for r in trace.records) is False  # only interesting ops are kept by default
    with OpTracer(model, record="all") as trace:
        model(torch.randn(2, 4))
    assert [r.module for r in trace.records if r.op == "linear"] == ["0"]


def test_nan_inputs(healthy):
    bad = run_probe_on("nan-inputs", load_example("broken_nan_in_inputs"))
    assert bad.outcome == "found" and bad.data["features"] == [5] and bad.data["bad_inputs"] > 0
    assert bad.data["coverage"] == "the whole set"
    assert run_probe_on("nan-inputs", healthy).outcome == "ok"


def test_nan_bisect_names_op_line_and_phase(healthy):
    result = run_probe_on("nan-bisect", load_example("broken_missing_epsilon"))
    assert result.outcome == "loss", result.summary
    assert result.data["op"] == "log" and result.data["zero_input"] is True
    assert result.data["where"].startswith("broken_missing_epsilon.py:")
    assert result.data["replays"] <= 2  # localisation costs at most a couple of extra steps
    inputs = run_probe_on("nan-bisect", load_example("broken_nan_in_inputs"))
    assert inputs.outcome == "inputs" and inputs.data["replays"] == 0
    assert run_probe_on("nan-bisect", healthy).outcome == "ok"


def test_nan_bisect_backward_phase(tmp_path):
    # sqrt of a zero vector's squared norm: forward finite, backward 1/(2*0) = inf
    path = tmp_path / "norm_zero.py"
    path.write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\n"
        "def build_model():\n    return nn.Linear(4, 2)\n"
        "def build_data():\n    x = torch.randn(64, 4); x[:, :] = 0.0\n    y = torch.zeros(64, 2)\n"
        "    return TensorDataset(x, y), None\n"
        "def loss_fn(out, y):\n    d = out - out.detach()\n    return torch.sqrt((d * d).sum()) + ((out - y) ** 2).mean()\n")
    from nnwizard.target import load_target

    result = run_probe_on("nan-bisect", load_target(str(path), "cpu"))
    assert result.outcome == "backward", result.summary
    assert result.data["op"] == "sqrt" and "norm_zero.py" in result.data["where"]


def test_nan_repair_separates_lr_from_explosion():
    lr = run_probe_on("nan-repair", load_example("broken_lr_too_high"))
    assert lr.outcome in ("lr-fixes", "both-fix") and lr.data["lr10_finite"]
    explode = run_probe_on("nan-repair", load_example("broken_exploding_gradients"))
    assert explode.outcome == "clip-fixes" and not explode.data["lr10_finite"]


def test_epsilon_scan(healthy):
    result = run_probe_on("epsilon-scan", load_example("broken_missing_epsilon"))
    assert result.outcome == "unguarded" and result.data["static_where"].startswith("broken_missing_epsilon.py:")
    assert run_probe_on("epsilon-scan", healthy).outcome == "ok"


def test_epsilon_scan_dynamic(tmp_path):
    path = tmp_path / "norm_std.py"
    path.write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\n"
        "class M(nn.Module):\n    def __init__(self):\n        super().__init__(); self.fc = nn.Linear(4, 2)\n"
        "    def forward(self, x):\n        return self.fc((x - x.mean(0)) / x.std(0))\n"
        "def build_model():\n    return M()\n"
        "def build_data():\n    x = torch.randn(64, 4); x[:, 2] = 1.0\n    return TensorDataset(x, torch.randint(0, 2, (64,))), None\n"
        "loss_fn = nn.CrossEntropyLoss()\n")
    from nnwizard.target import load_target

    result = run_probe_on("epsilon-scan", load_target(str(path), "cpu"))
    assert result.outcome == "near-zero" and result.data["op"] == "div" and result.data["min_abs"] == 0.0
    assert "norm_std.py:8" in result.data["where"]


def test_amp_overflow_cpu_autocast(healthy):
    result = run_probe_on("amp-overflow", load_example("broken_amp_overflow"))
    if result.status == "skipped":
        pytest.skip(result.summary)
    assert result.outcome == "overflow" and result.data["layer"] == "0" and result.data["uses_amp"]
    quiet = run_probe_on("amp-overflow", healthy)
    assert quiet.outcome in ("ok", "skipped") and not quiet.data.get("uses_amp")


@pytest.mark.parametrize("name", ["broken_nan_in_inputs", "broken_missing_epsilon", "broken_lr_too_high",
                                  "broken_exploding_gradients"])
def test_nan_diagnoses(name):
    import importlib

    expected = importlib.import_module(f"examples.{name}").EXPECTED
    _, report = diagnose_example(name, expected["symptoms"])
    top = report.hypotheses[0]
    assert top.id in expected["hypotheses"] and top.confidence >= 0.5, [(h.id, h.confidence) for h in report.hypotheses[:3]]


@cuda
def test_amp_overflow_diagnosis_on_cuda():
    from nnwizard.report import build
    from nnwizard.session import Options, diagnose
    from tests.conftest import EXAMPLES

    report = build(diagnose(Options(module=str(EXAMPLES / "broken_amp_overflow.py"), symptoms=["nan"], device="cuda")))
    assert report.hypotheses[0].id == "amp-overflow"
