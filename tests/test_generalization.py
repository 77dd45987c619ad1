"""linear-stack and capacity-check, and the generalization diagnoses (overfitting, underfitting,
capacity-too-small, missing-nonlinearity)."""

from __future__ import annotations

import textwrap

import pytest

from nnwizard.target import load_target
from tests.conftest import diagnose_example, load_example, run_probe_on


def _module(tmp_path, body: str):
    path = tmp_path / f"gen_{tmp_path.name.replace('-', '_')}.py"
    path.write_text(textwrap.dedent(body))
    return load_target(str(path), "cpu")


def test_linear_stack_fires_on_layers_without_activation():
    result = run_probe_on("linear-stack", load_example("broken_missing_nonlinearity"))
    assert result.outcome == "linear-stack" and result.data["affinity_error"] < 1e-4
    assert result.data["adjacent"] == ["0 -> 1", "1 -> 2"]


def test_linear_stack_quiet_on_healthy_and_functional_activations(tmp_path):
    assert run_probe_on("linear-stack", load_example("healthy_mlp")).outcome == "ok"
    target = _module(tmp_path, """
        import torch.nn.functional as F
        from torch import nn
        from examples.datasets import blobs, split

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

            def forward(self, x):
                return self.b(F.relu(self.a(x)))   # the activation is a function, not a module

        def build_model():
            return Net()

        def build_data():
            return split(*blobs())

        loss_fn = nn.CrossEntropyLoss()
    """)
    result = run_probe_on("linear-stack", target)
    assert result.outcome == "adjacent-affine" and result.data["affinity_error"] > 1e-3


def test_constant_output_is_not_called_linear(tmp_path):
    target = _module(tmp_path, """
        import torch
        from torch import nn
        from examples.datasets import blobs, split

        def build_model():
            m = nn.Sequential(nn.Linear(16, 8), nn.Linear(8, 4))
            with torch.no_grad():
                m[1].weight.zero_()       # output = bias only: constant, trivially affine
            return m

        def build_data():
            return split(*blobs())

        loss_fn = nn.CrossEntropyLoss()
    """)
    assert run_probe_on("linear-stack", target).outcome == "ok"


def test_capacity_check_outcomes():
    small = run_probe_on("capacity-check", load_example("broken_capacity_too_small"))
    assert small.outcome == "too-small" and small.data["bottleneck"] and small.data["narrowest_width"] == 1
    held = run_probe_on("capacity-check", load_example("broken_underfitting"))
    assert held.outcome == "optimizer-holds-back" and held.data["weight_decay"] == pytest.approx(0.3)
    fine = run_probe_on("capacity-check", load_example("healthy_mlp"))
    assert fine.outcome == "ok" and fine.status == "passed"


@pytest.mark.parametrize("name, wanted", [
    ("broken_capacity_too_small", "capacity-too-small"),
    ("broken_underfitting", "underfitting"),
    ("broken_missing_nonlinearity", "missing-nonlinearity"),
])
def test_auto_diagnosis(name, wanted):
    _, report = diagnose_example(name, ("auto",))
    assert report.hypotheses[0].id == wanted and report.hypotheses[0].confidence >= 0.5, \
        [(h.id, round(h.confidence, 2)) for h in report.hypotheses[:3]]


def test_declared_overfitting():
    _, report = diagnose_example("broken_overfitting", ("overfitting",))
    top = report.hypotheses[0]
    assert top.id == "overfitting" and top.confidence >= 0.5
    assert any("step" in e for e in top.evidence)
