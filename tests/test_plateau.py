"""A rate too low and a model too small, named only from measurements: the lr sweep tries lr*1000 when
lr*100 is still below the rates the optimizer usually trains at (and says what would measure it when it
cannot), and capacity-check runs for a flat or auto session whose ladder or curve points at the model."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch import nn
import torch

from nnwizard.probes.api import ProbeContext, load_all
from nnwizard.probes.lr import usual_lr
from nnwizard.session import Options, diagnose
from nnwizard.report import build
from nnwizard.target import load_target

PROBES = load_all()
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_usual_rates():
    params = [nn.Parameter(torch.zeros(1))]
    assert usual_lr(torch.optim.SGD(params, lr=0.1)) == 1e-2 and usual_lr(torch.optim.AdamW(params)) == 1e-3


def test_the_sweep_goes_a_decade_further_for_a_rate_1000x_too_low():
    result = PROBES["lr-sweep"](ProbeContext(load_target(str(EXAMPLES / "broken_lr_too_low_sgd.py"), "cpu")))
    assert result.outcome == "too-low", result.summary
    assert "lr*1000 (0.01)" in result.summary


def test_a_sweep_that_stays_below_the_usual_rates_says_what_would_measure_it(tmp_path):
    path = tmp_path / "tiny_lr.py"
    path.write_text((EXAMPLES / "broken_lr_too_low_sgd.py").read_text().replace("lr=1e-5", "lr=1e-8"), encoding="utf-8")
    result = PROBES["lr-sweep"](ProbeContext(load_target(str(path), "cpu")))
    assert result.data.get("cannot_run") == "not-measured", result.summary
    assert "would measure whether the rate is too low" in result.summary


@pytest.mark.slow
@pytest.mark.parametrize("name, symptom, top", [
    ("broken_capacity_two_units", "flat", "capacity-too-small"),
    ("broken_capacity_two_units", "auto", "capacity-too-small"),
    ("broken_lr_too_low_sgd", "flat", "lr-too-low"),
    ("healthy_rings", "flat", None),
])
def test_sessions(name, symptom, top):
    report = build(diagnose(Options(module=str(EXAMPLES / f"{name}.py"), symptoms=[symptom], device="cpu")))
    if top is None:
        assert report.verdict == "healthy", [(h.id, h.confidence) for h in report.hypotheses]
    else:
        assert report.hypotheses[0].id == top and report.hypotheses[0].confidence >= 0.5, \
            [(h.id, h.confidence) for h in report.hypotheses[:3]]
