"""loss-output-audit and shape-audit: both directions, the marked layer row in the report, and the
scripted diagnosis of each broken model-fit example."""

from __future__ import annotations

import importlib

import pytest

from tests.conftest import diagnose_example, load_example, run_probe_on
from tests.test_data import module

pytestmark = pytest.mark.filterwarnings("ignore:Using a target size")

SIGMOID_BCE_LOGITS = """
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    x = torch.randn(200, 5)
    y = (x[:, 0] > 0).float().unsqueeze(1)
    def build_model(): return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 1), nn.Sigmoid())
    def build_data(): return TensorDataset(x[:150], y[:150]), TensorDataset(x[150:], y[150:])
    loss_fn = nn.BCEWithLogitsLoss()
"""

LOGSOFTMAX_NLL = """
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    x = torch.randn(200, 5)
    y = (x[:, 0] > 0).long()
    def build_model(): return nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2), nn.LogSoftmax(dim=1))
    def build_data(): return TensorDataset(x[:150], y[:150]), TensorDataset(x[150:], y[150:])
    loss_fn = nn.NLLLoss()
"""

RELU_LOGITS_CE = """
    import torch
    from torch import nn
    from torch.utils.data import TensorDataset
    x = torch.randn(200, 5)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    def build_model(): return nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3), nn.ReLU())
    def build_data(): return TensorDataset(x[:150], y[:150]), TensorDataset(x[150:], y[150:])
    loss_fn = nn.CrossEntropyLoss()
"""


# ----------------------------------------------------------------------------- loss-output-audit
@pytest.mark.parametrize("name,outcome", [
    ("broken_double_softmax", "double-softmax"),
    ("broken_loss_output_mismatch", "logits-to-bce"),
    ("broken_loss_output_mismatch_nll", "logits-to-nll"),
    ("broken_softmax_wrong_dim", "other-dim"),
])
def test_loss_output_audit_fires(name, outcome):
    r = run_probe_on("loss-output-audit", load_example(name))
    assert (r.status, r.outcome) == ("failed", outcome), r.summary


def test_double_softmax_measures_floor_and_gradient():
    r = run_probe_on("loss-output-audit", load_example("broken_double_softmax"))
    assert r.data["last_type"] == "Softmax" and abs(r.data["loss_floor"] - 0.7437) < 1e-3
    assert 0 < r.data["grad_ratio"] < 1          # the extra softmax shrinks the gradient at the logits


def test_loss_output_audit_double_sigmoid(tmp_path):
    r = run_probe_on("loss-output-audit", module(tmp_path, "sig", SIGMOID_BCE_LOGITS))
    assert r.outcome == "double-sigmoid"


def test_loss_output_audit_relu_after_logits(tmp_path):
    r = run_probe_on("loss-output-audit", module(tmp_path, "relu", RELU_LOGITS_CE))
    assert r.outcome == "clamped-logits", r.summary
    quiet = run_probe_on("loss-output-audit", module(tmp_path, "plain", RELU_LOGITS_CE.replace(", nn.Linear(16, 3), nn.ReLU())", ", nn.Linear(16, 3))")))
    assert quiet.status == "passed", quiet.summary


def test_loss_output_audit_quiet_on_logsoftmax_nll(tmp_path):
    r = run_probe_on("loss-output-audit", module(tmp_path, "lsm", LOGSOFTMAX_NLL))
    assert r.status == "passed", r.summary


@pytest.mark.parametrize("name", ["healthy_mlp", "healthy_cnn", "healthy_breast_cancer", "healthy_diabetes", "healthy_transformer"])
def test_loss_output_audit_quiet_on_healthy(name):
    r = run_probe_on("loss-output-audit", load_example(name))
    assert r.status == "passed", r.summary


# ----------------------------------------------------------------------------------- shape-audit
def test_shape_audit_names_layer_and_arithmetic():
    r = run_probe_on("shape-audit", load_example("broken_shape_mismatch"))
    assert (r.status, r.outcome) == ("failed", "layer-mismatch")
    assert r.data["layer_type"] == "Linear" and r.data["got"] == 200 and r.data["expected"] == 288
    assert "6x6" in r.summary and "5x5" in r.summary and "no padding" in r.summary
    table = r.artifacts[0]
    assert table.marked and table.rows[table.marked[0]][1] == "Linear"
    assert any("=10" in str(row[4]) for row in table.rows)      # the conv's size arithmetic


def test_shape_audit_silent_broadcast():
    r = run_probe_on("shape-audit", load_example("broken_shape_broadcast"))
    assert (r.status, r.outcome) == ("failed", "broadcast")
    assert r.data["broadcast_shape"] == [32, 32] and r.data["loss_paired"] < r.data["loss_broadcast"]


@pytest.mark.parametrize("name", ["healthy_mlp", "healthy_cnn", "healthy_diabetes", "healthy_breast_cancer", "healthy_transformer"])
def test_shape_audit_quiet_on_healthy(name):
    r = run_probe_on("shape-audit", load_example(name))
    assert r.status == "passed", r.summary


def test_shape_crash_report_marks_faulty_row(tmp_path):
    from nnwizard.markdown import render_markdown

    diagnosis, report = diagnose_example("broken_shape_mismatch", ["crash"])
    text = render_markdown(report, tmp_path / "crash.md").read_text()
    section = text.split("(`shape-audit`)", 1)[1]
    assert "⟶ **4** | **Linear** | **[32, 200]**" in section


# ------------------------------------------------------------------------------------ diagnoses
@pytest.mark.parametrize("name,hypothesis", [
    ("broken_double_softmax", "double-softmax"),
    ("broken_loss_output_mismatch", "loss-output-mismatch"),
    ("broken_loss_output_mismatch_nll", "loss-output-mismatch"),
    ("broken_shape_broadcast", "shape-broadcast"),
    ("broken_shape_mismatch", "layer-shape-mismatch"),
])
def test_diagnosis_top1(name, hypothesis):
    symptoms = importlib.import_module(f"examples.{name}").EXPECTED["symptoms"]
    _, report = diagnose_example(name, symptoms)
    assert report.hypotheses and report.hypotheses[0].id == hypothesis and report.hypotheses[0].confidence >= 0.5
