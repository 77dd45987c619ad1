"""eval-mode-audit and no-grad-audit on the user's evaluate, both ways, and the scripted diagnoses."""

from __future__ import annotations

import importlib

import pytest

from tests.conftest import diagnose_example, load_example, run_probe_on
from tests.test_loop import inline


def test_eval_mode_audit_fires_without_model_eval():
    result = run_probe_on("eval-mode-audit", load_example("broken_eval_mode_missing"))
    assert result.outcome == "train-mode"
    assert result.data["training_layers"] == 2 and result.data["bn_drift"] > 0
    assert result.data["user_loss"] != pytest.approx(result.data["eval_loss"])


@pytest.mark.parametrize("name", ["healthy_cnn", "healthy_amp", "broken_no_grad_missing"])
def test_eval_mode_audit_quiet(name):
    result = run_probe_on("eval-mode-audit", load_example(name))
    assert result.outcome == "ok" and result.data["bn_drift"] == 0


def test_eval_mode_audit_without_mode_layers(tmp_path):
    target = inline(tmp_path, """
        def evaluate(model, loader, loss_fn):
            with torch.no_grad():
                return sum(loss_fn(model(x), y).item() for x, y in loader)
    """, "inline_eval_plain")
    assert run_probe_on("eval-mode-audit", target).outcome == "no-mode-layers"
    assert run_probe_on("no-grad-audit", target).outcome == "ok"


def test_no_grad_audit_both_ways():
    result = run_probe_on("no-grad-audit", load_example("broken_no_grad_missing"))
    assert result.outcome == "graph-built" and result.data["saved_bytes"] > 0 and result.data["grad_fn"] != "none"
    for name in ("healthy_cnn", "healthy_amp", "broken_eval_mode_missing"):
        quiet = run_probe_on("no-grad-audit", load_example(name))
        assert quiet.outcome == "ok" and quiet.data["saved_bytes"] == 0


def test_skipped_without_user_evaluate():
    assert run_probe_on("eval-mode-audit", load_example("healthy_mlp")).status == "skipped"
    assert run_probe_on("no-grad-audit", load_example("healthy_mlp")).status == "skipped"


@pytest.mark.parametrize("name, hypothesis", [("broken_eval_mode_missing", "eval-mode-missing"),
                                              ("broken_no_grad_missing", "no-grad-missing")])
def test_diagnoses(name, hypothesis):
    expected = importlib.import_module(f"examples.{name}").EXPECTED
    _, report = diagnose_example(name, expected["symptoms"])
    assert report.hypotheses[0].id == hypothesis and report.hypotheses[0].confidence >= 0.5
