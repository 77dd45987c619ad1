"""Replay never calls an anomaly healthy: a bundle's anomaly that no hypothesis explains is inconclusive,
naming what was tried; a spike while the rate is still rising weighs as a rate problem, with the line where
the schedule is set."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from nnwizard.engine import Diagnosis
from nnwizard.probes.api import passed
from nnwizard.report import not_run, verdict

ROOT = Path(__file__).resolve().parents[1]


def test_an_unexplained_anomaly_is_inconclusive_and_says_what_was_tried():
    target = SimpleNamespace(spec="train.py", device="cpu", anomaly="loss-spike at step 22: loss 4.2x the recent range",
                             crashed=False, untrained=False)
    diagnosis = Diagnosis(target, 0, ["oscillating"], ["oscillating"])
    diagnosis.results = [_result("replay-batch", "ok"), _result("replay-repair", "neither")]
    assert verdict(diagnosis) == "inconclusive"
    entry = next(n for n in not_run(diagnosis) if n.why == "anomaly-unexplained")
    assert "loss-spike at step 22" in entry.reason and "replay-batch (ok)" in entry.reason and "replay-repair (neither)" in entry.reason


def test_without_an_anomaly_the_same_results_are_healthy():
    target = SimpleNamespace(spec="train.py", device="cpu", crashed=False, untrained=False)
    diagnosis = Diagnosis(target, 0, ["auto"], ["auto"])
    diagnosis.results = [_result("replay-batch", "ok")]
    assert verdict(diagnosis) == "healthy" and not not_run(diagnosis)


def _result(pid, outcome):
    r = passed(f"{pid} measured", outcome)
    r.id = pid
    return r


@pytest.mark.slow
def test_a_spike_during_a_ramp_is_read_as_the_rate_with_the_schedule_line(monkeypatch, tmp_path):
    from nnwizard.replay import replay, report_dict
    from nnwizard.watch_cmd import run

    monkeypatch.chdir(tmp_path)
    run(str(ROOT / "examples" / "watch" / "ramp_spike.py"), ["--steps", "260"], tmp_path / "w", "stop", 10,
        tensorboard=False)
    bundles = sorted((tmp_path / "w").glob("anomaly-step*"), key=lambda p: int(p.name[12:]))
    assert bundles, "the spike should have been caught"
    meta = json.loads((bundles[0] / "meta.json").read_text())
    assert 150 < meta["step"] < 260
    data = report_dict(*replay(bundles[0]))
    top = data["hypotheses"][0]
    assert top["id"] == "lr-too-high" and data["verdict"] == "problems-found", data["hypotheses"][:2]
    assert "ramp_spike.py:" in top["fix_here"] and "LambdaLR" in top["fix_here"]
