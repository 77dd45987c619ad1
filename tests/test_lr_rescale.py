"""The scaled-learning-rate intervention (``Recorder(lr_scale=...)``, the script-mode lr sweep) scales the
rate the script actually trains with: also a rate the loop sets by hand at every step (nanoGPT's
``param_group['lr'] = get_lr(it)``), without scaling twice a rate derived from the scaled one (an
LRScheduler's step, ``g['lr'] *= 0.5``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from nnwizard.record import Recorder


def _absolute(opt, sched, it):   # a warm-up written in the loop: the rate from the script's own formula
    for g in opt.param_groups:
        g["lr"] = 0.1 * (it + 1) / 5


def _decay(opt, sched, it):      # a hand-written decay of the current rate
    if it:
        for g in opt.param_groups:
            g["lr"] *= 0.5


def _steplr(opt, sched, it):
    if it:
        sched.step()


def _run(mode: str, schedule, scale: float | None) -> tuple[list[float], float]:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x = torch.randn(8, 3)
    with Recorder(mode, lr_scale=scale) as rec:
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for it in range(5):
            schedule(opt, sched, it)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return [s.lrs[0] for s in rec.recording.steps], opt.param_groups[0]["lr"]


@pytest.mark.parametrize("mode", ["full", "light"])
@pytest.mark.parametrize("schedule", [_absolute, _decay, _steplr])
def test_each_step_trains_with_the_scripts_own_rate_times_the_scale(mode, schedule):
    plain, end = _run(mode, schedule, None)
    scaled, scaled_end = _run(mode, schedule, 10.0)
    assert scaled == pytest.approx([10 * v for v in plain]), (plain, scaled)
    assert scaled_end == pytest.approx(end)   # the script's optimizer is handed back at its own rate


def test_without_a_scale_a_hand_set_rate_is_left_alone():
    plain, _ = _run("full", _absolute, None)
    assert plain == pytest.approx([0.02, 0.04, 0.06, 0.08, 0.1])


def _hand_written(scale: float | None) -> torch.Tensor:
    """One hand-written SGD step (no torch.optim), the change it made to the weights."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x = torch.randn(8, 3)
    before = model.weight.detach().clone()
    with Recorder("full", lr_scale=scale):
        for _ in range(2):
            model.zero_grad()
            model(x).pow(2).mean().backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
            break
    return model.weight.detach() - before


def test_a_hand_written_update_is_scaled_through_its_gradients():
    plain, scaled = _hand_written(None), _hand_written(10.0)
    assert torch.allclose(scaled, 10 * plain, rtol=1e-4, atol=1e-7)
    # the hooks are gone afterwards: the same parameter trains at its own rate again
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    with Recorder("full", lr_scale=10.0):
        model(torch.randn(8, 3)).sum().backward()
    model.zero_grad()
    model(torch.ones(1, 3)).sum().backward()
    assert torch.allclose(model.weight.grad, torch.ones(1, 3))
