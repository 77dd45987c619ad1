"""triage-run (the measurement behind --symptom auto) and the auto diagnoses of this family's examples."""

from __future__ import annotations

import pytest

from tests.conftest import diagnose_example, load_example, run_probe_on


def test_healthy_run_measures_no_symptom():
    result = run_probe_on("triage-run", load_example("healthy_mlp"))
    assert result.outcome == "ok" and result.data["symptoms"] == []
    assert result.data["steps"] >= 100 and len(result.data["val"]) >= 6  # a real curve, with validation


def test_flat_curve_from_a_loop_without_step():
    result = run_probe_on("triage-run", load_example("broken_no_step"))
    assert result.outcome == "flat" and result.data["symptoms"] == ["flat"]
    assert result.data["loop"] == "train_step"


def test_overfitting_curve_has_best_step():
    result = run_probe_on("triage-run", load_example("broken_overfitting"))
    assert result.outcome == "overfitting" and result.data["symptoms"] == ["overfitting"]
    assert 0 < result.data["best_step"] < result.data["steps"]
    assert result.data["val_end"] > result.data["val_best"]


def test_still_high_run_reports_underfitting():
    result = run_probe_on("triage-run", load_example("broken_underfitting"))
    assert "underfitting" in result.data["symptoms"]


def test_crash_is_a_symptom():
    result = run_probe_on("triage-run", load_example("broken_label_dtype"))
    assert result.outcome == "crashed" and result.data["symptoms"] == ["crash"]


def test_user_epoch_gives_a_per_step_curve_and_schedule_end_is_not_a_crash():
    # healthy_binary_onecycle steps OneCycleLR per batch in its own train_epoch; its schedule ends
    # after 10 epochs, which must stop the run quietly rather than count as a crash
    result = run_probe_on("triage-run", load_example("healthy_binary_onecycle"))
    assert result.data["loop"] == "train_epoch"
    assert result.data["steps"] > result.data["epochs"]  # the loss recorder saw every step
    assert result.outcome == "ok", result.summary


@pytest.mark.parametrize("name, wanted", [
    ("broken_overfitting", "overfitting"),
    ("broken_no_step", "missing-optimizer-step"),
])
def test_auto_diagnoses_without_being_told(name, wanted):
    diagnosis, report = diagnose_example(name, ("auto",))
    assert "triage" in diagnosis.trees
    assert report.hypotheses[0].id == wanted and report.hypotheses[0].confidence >= 0.5


@pytest.mark.parametrize("name", ["healthy_regression", "healthy_binary_onecycle"])
def test_auto_keeps_healthy_examples_healthy(name):
    _, report = diagnose_example(name, ("auto",))
    assert report.verdict == "healthy", [(h.id, h.confidence) for h in report.hypotheses[:3]]
