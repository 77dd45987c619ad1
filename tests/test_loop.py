"""Loop audits: each probe fires on a module with the fault and stays quiet on correct loops, and the
scripted diagnosis of every loop example puts the right hypothesis first (healthy ones stay healthy)."""

from __future__ import annotations

import textwrap

import pytest

from tests.conftest import diagnose_example, load_example, run_probe_on

BASE = """
import torch
from torch import nn
from examples.datasets import blobs, split

def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

def build_data():
    return split(*blobs())

loss_fn = nn.CrossEntropyLoss()
"""


def inline(tmp_path, body: str, name: str = "inline_loop"):
    """A target from BASE plus ``body`` (later definitions override BASE's), under a module name of
    its own (imported modules are cached by name)."""
    from nnwizard.target import load_target

    name = f"{name}_{tmp_path.name}".replace("-", "_")
    path = tmp_path / f"{name}.py"
    path.write_text(BASE + textwrap.dedent(body))
    return load_target(str(path), "cpu")


# ------------------------------------------------------------------------------------ step-audit
@pytest.mark.parametrize("name, outcome", [
    ("broken_no_step", "no-step"),
    ("broken_missing_backward", "no-backward"),
    ("broken_missing_zero_grad", "carry-over"),
])
def test_step_audit_fires(name, outcome):
    result = run_probe_on("step-audit", load_example(name))
    assert (result.status, result.outcome) == ("failed", outcome), result.summary
    assert "train_step" in result.summary


@pytest.mark.parametrize("name", ["healthy_cnn", "healthy_amp", "healthy_clip_accum", "healthy_zero_grad_keep",
                                  "healthy_epoch_scheduler", "broken_loss_wrong_tensor"])
def test_step_audit_quiet_on_correct_steps(name):
    result = run_probe_on("step-audit", load_example(name))
    assert (result.status, result.outcome) == ("passed", "ok"), result.summary


def test_step_audit_skips_the_reference_loop():
    assert run_probe_on("step-audit", load_example("healthy_mlp")).status == "skipped"


def test_step_audit_numbers_separate_step_from_backward():
    no_step = run_probe_on("step-audit", load_example("broken_no_step")).data
    no_backward = run_probe_on("step-audit", load_example("broken_missing_backward")).data
    assert no_step["grad_norm"] > 0 and no_step["steps"] == 0 and no_step["max_param_change"] == 0
    assert no_backward["grad_norm"] == 0 and no_backward["steps"] == 3 and no_backward["ref_grad_norm"] > 0


def test_step_audit_parses_a_detached_loss_crash(tmp_path):
    target = inline(tmp_path, """
        def train_step(model, batch, loss_fn, optimizer):
            x, y = batch
            optimizer.zero_grad()
            loss = loss_fn(model(x).detach(), y)
            loss.backward()
            optimizer.step()
            return loss.item()
    """)
    result = run_probe_on("step-audit", target)
    assert result.outcome == "crashed"
    assert result.data["kind"] == "no-grad" and result.data["reference_ok"] is True
    assert "inline_loop" in result.data["where"]


def test_step_audit_no_update_when_optimizer_holds_another_model(tmp_path):
    target = inline(tmp_path, """
        def build_optimizer(model):
            return torch.optim.SGD(build_model().parameters(), lr=0.1)

        def train_step(model, batch, loss_fn, optimizer):
            x, y = batch
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            return loss.item()
    """)
    assert run_probe_on("step-audit", target).outcome == "no-update"
    assert run_probe_on("optimizer-coverage", target).outcome == "foreign"


# ------------------------------------------------------------------------------- scale and target
def test_loss_scale_audit_fires_on_accumulation_without_dividing():
    result = run_probe_on("loss-scale-audit", load_example("broken_loss_reduction_mismatch"))
    assert result.outcome == "scaled-gradient"
    assert result.data["scale"] == pytest.approx(4.0, rel=0.1) and result.data["micro_batches"] == 4


def test_loss_scale_audit_fires_on_sum_reduction(tmp_path):
    target = inline(tmp_path, "loss_fn = nn.CrossEntropyLoss(reduction='sum')\n")
    result = run_probe_on("loss-scale-audit", target)
    assert result.outcome == "sum-reduction" and result.data["duplication_ratio"] == pytest.approx(2.0, rel=1e-3)


@pytest.mark.parametrize("name", ["healthy_clip_accum", "healthy_amp", "healthy_mlp", "healthy_epoch_scheduler"])
def test_loss_scale_audit_quiet(name):
    assert run_probe_on("loss-scale-audit", load_example(name)).outcome == "ok"


def test_loss_target_audit_both_ways():
    wrong = run_probe_on("loss-target-audit", load_example("broken_loss_wrong_tensor"))
    assert wrong.outcome == "wrong-direction" and wrong.data["cosine"] < 0.5
    for name in ("healthy_cnn", "healthy_amp", "healthy_clip_accum"):
        assert run_probe_on("loss-target-audit", load_example(name)).outcome == "ok"


# ------------------------------------------------------------------- optimizer and requires_grad
def test_optimizer_coverage_both_ways():
    missing = run_probe_on("optimizer-coverage", load_example("broken_optimizer_missing_params"))
    assert missing.outcome == "missing" and "encoder" in missing.data["missing_modules"]
    for name in ("healthy_partly_frozen", "healthy_mlp", "healthy_cnn"):
        assert run_probe_on("optimizer-coverage", load_example(name)).outcome == "ok"


@pytest.mark.parametrize("name, outcome", [
    ("broken_frozen", "all-frozen"), ("broken_frozen_partial", "head-frozen"),
    ("healthy_partly_frozen", "partly-frozen"), ("healthy_mlp", "ok"),
])
def test_requires_grad_audit(name, outcome):
    result = run_probe_on("requires-grad-audit", load_example(name))
    assert result.outcome == outcome, result.summary
    if outcome == "all-frozen":
        assert "does not require grad" in result.data["backward_error"]


def test_disconnected_params_both_ways():
    result = run_probe_on("disconnected-params", load_example("broken_disconnected_parameters"))
    assert result.outcome == "disconnected" and "encoder" in result.data["modules"]
    assert ".detach()" in result.data["cuts"]
    for name in ("healthy_mlp", "healthy_partly_frozen", "healthy_cnn"):
        assert run_probe_on("disconnected-params", load_example(name)).outcome == "ok"


# ------------------------------------------------------------------------------------- diagnoses
LOOP_BROKEN = ["broken_no_step", "broken_missing_zero_grad", "broken_missing_backward", "broken_optimizer_missing_params",
               "broken_frozen", "broken_frozen_partial", "broken_disconnected_parameters", "broken_loss_wrong_tensor",
               "broken_loss_reduction_mismatch", "broken_loss_reduction_mismatch_sum"]
LOOP_HEALTHY = ["healthy_clip_accum", "healthy_amp", "healthy_zero_grad_keep", "healthy_partly_frozen"]


def _expected(name):
    import importlib

    return importlib.import_module(f"examples.{name}").EXPECTED


@pytest.mark.parametrize("name", LOOP_BROKEN)
def test_diagnosis_puts_the_loop_bug_first(name):
    expected = _expected(name)
    _, report = diagnose_example(name, expected["symptoms"])
    top = report.hypotheses[0]
    assert top.id in expected["hypotheses"] and top.confidence >= 0.5, [(h.id, h.confidence) for h in report.hypotheses[:3]]


@pytest.mark.parametrize("name", LOOP_HEALTHY)
@pytest.mark.parametrize("declared", [False, True])
def test_correct_loops_stay_healthy(name, declared):
    symptoms = _expected(name)["symptoms"] if declared else ["auto"]
    _, report = diagnose_example(name, symptoms)
    assert report.verdict == "healthy", [(h.id, h.confidence) for h in report.hypotheses[:3]]


def test_step_evidence_rules_out_the_alternatives():
    _, report = diagnose_example("broken_no_step", ["flat"])
    by_id = {h.id: h for h in report.hypotheses}
    assert by_id["missing-optimizer-step"].confidence >= 0.9
    assert "missing-backward" not in by_id or by_id["missing-backward"].confidence < 0.2
    assert any("train_step computed gradients" in str(e) for e in by_id["missing-optimizer-step"].evidence)


# ------------------------------------------------------------------- carry-over marker test
ZERO_AT_END = """
def train_step(model, batch, loss_fn, optimizer):
    x, y = batch
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()          # cleared after the step: correct
    return loss.item()
"""


def test_marker_carry_tells_cleared_from_carried(tmp_path):
    from nnwizard.probes.loop import marker_carry

    cleared = inline(tmp_path, ZERO_AT_END, "zero_at_end")
    batches = cleared.batches(3)
    assert marker_carry(cleared, 0, batches, "train_step") == pytest.approx(0.0, abs=1e-6)
    carried = load_example("broken_missing_zero_grad")
    assert marker_carry(carried, 0, carried.batches(3), "train_step") == pytest.approx(1.0, abs=1e-3)
    assert run_probe_on("step-audit", cleared).outcome == "ok"


def test_the_loop_audit_run_stands_in_for_the_unmarked_marker_run(tmp_path):
    """The loop audit is seeded like the marker test, so its second-step gradients (float32, the only
    vectors it keeps besides the first step's and its reference) replace the test's unmarked run."""
    import torch

    from nnwizard.probes.loop import marker_carry, run_loop_audit

    for target, carry in ((inline(tmp_path, ZERO_AT_END, "zero_at_end"), 0.0), (load_example("broken_missing_zero_grad"), 1.0)):
        audit = run_loop_audit(target, 0)
        assert audit.first_grads.dtype == torch.float32 and audit.reference is not None and audit.steps == 3
        assert marker_carry(target, 0, target.batches(3), "train_step", audit.second_grads) == pytest.approx(carry, abs=1e-3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_loss_on_the_wrong_tensor_is_not_mistaken_for_carry_over(seed):
    """A loss against the model's own predictions bends the gradient away from the reference; the
    marker test does not compare with the reference, so it cannot be fooled by that."""
    result = run_probe_on("step-audit", load_example("broken_loss_wrong_tensor"), seed=seed)
    assert result.outcome == "ok" and result.data["carry"] < 0.01
    _, report = diagnose_example("broken_loss_wrong_tensor", ["underfitting"], seed=seed)
    assert report.hypotheses[0].id == "loss-wrong-tensor"
