"""scheduler-cadence: a per-iteration schedule stepped per epoch (and the reverse) is caught in the
user's train_epoch; a per-epoch schedule stepped per epoch is not."""

from __future__ import annotations

import importlib

from tests.conftest import diagnose_example, load_example, run_probe_on
from tests.test_loop import inline

EPOCH = """
def build_optimizer(model):
    return torch.optim.SGD(model.parameters(), lr=0.1)

def build_scheduler(optimizer):
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)

def train_epoch(model, loader, loss_fn, optimizer, scheduler):
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        {per_batch}
    {per_epoch}
    return 0.0
"""


def test_per_step_schedule_stepped_per_epoch():
    result = run_probe_on("scheduler-cadence", load_example("broken_scheduler_misplaced"))
    assert result.outcome == "per-epoch-for-per-step", result.summary
    assert result.data["scheduler_steps"] == result.data["epochs"] == 3
    assert result.data["lr_last_intended"] > 3 * result.data["lr_last"]
    plot = result.artifacts[0]
    assert len(plot.series) == 2 and all(len(s) == result.data["optimizer_steps"] for s in plot.series.values())


def test_epoch_schedule_stepped_per_epoch_is_quiet():
    result = run_probe_on("scheduler-cadence", load_example("healthy_epoch_scheduler"))
    assert result.outcome == "ok" and result.data["observed"] == "epoch"


def test_epoch_schedule_stepped_per_batch(tmp_path):
    target = inline(tmp_path, EPOCH.format(per_batch="scheduler.step()", per_epoch="pass"), "inline_sched_batch")
    result = run_probe_on("scheduler-cadence", target)
    assert result.outcome == "per-step-for-per-epoch", result.summary


def test_scheduler_never_stepped(tmp_path):
    target = inline(tmp_path, EPOCH.format(per_batch="pass", per_epoch="pass"), "inline_sched_never")
    assert run_probe_on("scheduler-cadence", target).outcome == "never-stepped"


def test_skipped_without_train_epoch_or_scheduler():
    assert run_probe_on("scheduler-cadence", load_example("healthy_cnn")).status == "skipped"
    assert run_probe_on("scheduler-cadence", load_example("broken_loss_reduction_mismatch")).status == "skipped"


def test_diagnoses():
    for name in ("broken_scheduler_misplaced", "healthy_epoch_scheduler"):
        expected = importlib.import_module(f"examples.{name}").EXPECTED
        _, report = diagnose_example(name, expected["symptoms"])
        if expected["hypotheses"]:
            assert report.hypotheses[0].id == "scheduler-misplaced" and report.hypotheses[0].confidence >= 0.5
        else:
            assert report.verdict == "healthy", [(h.id, h.confidence) for h in report.hypotheses[:3]]
