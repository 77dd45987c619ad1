"""schedule-ahead: each scheduler stepped ahead on a copy (a throwaway optimizer with the same groups), so
that a warm-up that will carry the rate far above the configured lr is seen before the run gets there; the
original scheduler and optimizer are untouched; a warm-up to 1x and a decay over the run stay quiet."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.optim import lr_scheduler as S

from nnwizard.probes.api import ProbeContext, ProbeResult, load_all
from nnwizard.probes.schedule_ahead import read_ahead, schedule_lines
from nnwizard.script_run import RunOptions, load_script, run_script
from nnwizard.script_target import ScriptTarget
from nnwizard.target import load_target

PROBES = load_all()
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _optimizer(lr=0.01):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=lr, momentum=0.9)


def test_read_ahead_starts_from_the_first_step_and_leaves_the_original_alone():
    opt = _optimizer()
    sched = S.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 200) * 100)
    for _ in range(30):
        opt.step()
        sched.step()
    before = opt.param_groups[0]["lr"]
    curve = read_ahead(sched, opt)
    assert curve["lrs"][0] == pytest.approx(0.01 * 100 / 200) and max(curve["lrs"]) == pytest.approx(1.0)
    assert opt.param_groups[0]["lr"] == before and sched.last_epoch == 30


@pytest.mark.parametrize("make, first, steps", [
    (lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=300), 0.1 / 25, 300),
    (lambda o: S.CosineAnnealingLR(o, T_max=50), 0.01, 50),
    (lambda o: S.ExponentialLR(o, gamma=0.9), 0.01, 5000),
    (lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=10), S.CosineAnnealingLR(o, T_max=90)],
                              milestones=[10]), 0.001, 100),
])
def test_read_ahead_of_the_common_schedulers(make, first, steps):
    opt = _optimizer()
    curve = read_ahead(make(opt), opt)
    assert curve["lrs"][0] == pytest.approx(first) and len(curve["lrs"]) == steps


def test_module_warmup_overshoot_and_its_healthy_twin():
    broken = PROBES["schedule-ahead"](ProbeContext(load_target(str(EXAMPLES / "broken_warmup_overshoot.py"), "cpu")))
    assert broken.outcome == "overshoot" and broken.data["peak_factor"] == pytest.approx(100), broken.summary
    healthy = PROBES["schedule-ahead"](ProbeContext(load_target(str(EXAMPLES / "healthy_warmup_cosine.py"), "cpu")))
    assert healthy.outcome == "ok" and healthy.data["peak_factor"] == pytest.approx(1.0), healthy.summary


def test_a_peak_above_what_the_sweep_measured_trainable():
    target = load_target(str(EXAMPLES / "healthy_warmup_cosine.py"), "cpu")
    sweep = ProbeResult(id="lr-sweep", status="failed", outcome="too-high", summary="",
                        data={"lr": 0.001, "drop_lrx10": float("-inf"), "drop_lr": 0.3})
    found = PROBES["schedule-ahead"](ProbeContext(target, results={"lr-sweep": sweep}))
    assert found.outcome == "above-trainable" and found.data["sweep_ceiling"] == pytest.approx(0.01), found.summary


SCRIPT = '''
import torch
from torch import nn
torch.manual_seed(0)
x, y = torch.randn(512, 8), torch.randint(0, 3, (512,))
net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))
opt = torch.optim.SGD(net.parameters(), lr=0.05)
sched = {SCHED}
for epoch in range(4):
    for i in range(0, 512, 32):
        loss = nn.functional.cross_entropy(net(x[i:i + 32]), y[i:i + 32])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
'''


@pytest.mark.parametrize("sched, outcome", [
    ("torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 500) * 50)", "overshoot"),
    ("torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.8)", "ends-early"),
    ("torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20))", "ok"),
])
def test_script_schedules(tmp_path, sched, outcome):
    path = tmp_path / "fit.py"
    path.write_text(SCRIPT.replace("{SCHED}", sched), encoding="utf-8")
    target = ScriptTarget(run_script(load_script(str(path)), [], RunOptions(max_steps=30)))
    result = PROBES["schedule-ahead"](ProbeContext(target))
    assert result.outcome == outcome, result.summary
    assert schedule_lines([path])[0].startswith("fit.py:8 `sched = torch.optim.lr_scheduler.")
