"""Script mode: faults of the loop's order found in public-script trials (session 4). Each a tiny script
written in tmp_path, recorded in this process, audited both ways."""

from __future__ import annotations

from pathlib import Path

import pytest

from nnwizard.probes.api import ProbeContext, load_all
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget

PROBES = load_all()

LOOP = '''
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
x, y = torch.randn(128, 8), torch.randint(0, 3, (128,))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
{FREEZE}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
for epoch in range(3):
    for xb, yb in loader:
        {BODY}
    scheduler.step()
'''
GOOD = "optimizer.zero_grad(); loss = F.cross_entropy(model(xb), yb); loss.backward(); optimizer.step()"
BETWEEN = "loss = F.cross_entropy(model(xb), yb); loss.backward(); optimizer.zero_grad(); optimizer.step()"
# zero_grad at the top of the loop, but step() before backward(): each step() follows a zero_grad of the previous
# iteration's gradients, and the first step() has no backward before it
STEP_FIRST = "optimizer.zero_grad(); loss = F.cross_entropy(model(xb), yb); optimizer.step(); loss.backward()"
FROZEN = "for p in model.parameters():\n    p.requires_grad = False"


def _target(tmp_path: Path, body: str, freeze: str = "") -> ScriptTarget:
    path = tmp_path / "train.py"
    path.write_text(LOOP.replace("{BODY}", body).replace("{FREEZE}", freeze), encoding="utf-8")
    return ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=8)))


def _probe(target, probe_id: str):
    return PROBES[probe_id](ProbeContext(target, params={}))


def test_zero_grad_between_backward_and_step_is_seen(tmp_path):
    result = _probe(_target(tmp_path, BETWEEN), "trace-backward-step")
    assert result.outcome == "no-grad-at-step" and result.data["zero_after_backward"], result.summary
    assert "zero_grad() ran after the backward and before optimizer.step() in 8 of them" in result.summary


def test_step_before_backward_is_a_zero_grad_between_them_from_the_second_step(tmp_path):
    result = _probe(_target(tmp_path, STEP_FIRST), "trace-backward-step")
    assert result.outcome == "no-grad-at-step" and result.data["zero_after_backward"], result.summary
    assert "in 7 of them" in result.summary


def test_steps_that_never_found_a_gradient_are_no_training_never_healthy(tmp_path):
    from nnwizard.script_view import untrained_note

    target = _target(tmp_path, STEP_FIRST)
    assert target.untrained and "None of the script's 8 optimizer steps found a gradient" in untrained_note(target)


def test_zero_grad_before_backward_is_quiet(tmp_path):
    target = _target(tmp_path, GOOD)
    assert _probe(target, "trace-backward-step").outcome == "ok"
    from nnwizard.script_view import untrained_note

    assert not target.untrained and untrained_note(target) is None
    assert not any(s.zero_grad_after_backward for s in target.recording.steps)


def _diagnose(tmp_path: Path, body: str, freeze: str = ""):
    from nnwizard.report import build
    from nnwizard.session import Options, diagnose

    path = tmp_path / "train.py"
    path.write_text(LOOP.replace("{BODY}", body).replace("{FREEZE}", freeze), encoding="utf-8")
    report = build(diagnose(Options(script=str(path), symptoms=["auto"], device="cpu", budget=20, max_steps=8)))
    return {h.id: h.confidence for h in report.hypotheses}


@pytest.mark.parametrize("body", [BETWEEN, STEP_FIRST])
def test_the_tree_names_the_misplaced_zero_grad(tmp_path, body):
    found = _diagnose(tmp_path, body)
    assert max(found, key=found.get) == "zero-grad-misplaced" and found["zero-grad-misplaced"] >= 0.85, found
    assert found.get("optimizer-missing-params", 0) < 0.5


def test_a_crash_in_the_first_backward_is_not_a_missing_step(tmp_path):
    """Everything frozen: the first backward raises. The crash names it (frozen-parameters); a run that never
    reached a step gets no missing-optimizer-step and no never-stepped scheduler."""
    found = _diagnose(tmp_path, GOOD, FROZEN)
    assert max(found, key=found.get) == "frozen-parameters" and found["frozen-parameters"] >= 0.5, found
    assert found.get("missing-optimizer-step", 0) < 0.5 and found.get("scheduler-misplaced", 0) < 0.5, found


def test_a_loop_that_never_steps_is_still_a_missing_step(tmp_path):
    found = _diagnose(tmp_path, "optimizer.zero_grad(); loss = F.cross_entropy(model(xb), yb); loss.backward()")
    assert max(found, key=found.get) == "missing-optimizer-step", found


def test_a_scripts_default_budget_counts_its_reruns_and_their_start_up(tmp_path):
    from nnwizard.script_target import BUDGET_RERUNS

    target = _target(tmp_path, GOOD)
    step = target.measured_step_s
    assert step and target.startup_s > 0
    assert target.default_plain_steps == pytest.approx(sum(BUDGET_RERUNS) + len(BUDGET_RERUNS) * target.startup_s / step)
