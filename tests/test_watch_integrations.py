"""Lightning and Hugging Face under watch: the callbacks, and `nnwizard watch --script` on scripts
that call Trainer.fit / Trainer.train (the real libraries, tiny models from configs, CPU)."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path

import pytest

WATCH = Path(__file__).resolve().parents[1] / "examples" / "watch"


def _run_example(name, args, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [name, *args])
    runpy.run_path(str(WATCH / name), run_name="__main__")


def _bundles(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("anomaly-step*"))


def test_lightning_callback_catches_the_corrupt_record(monkeypatch, tmp_path):
    pytest.importorskip("lightning")
    from nnwizard.replay import replay, report_dict

    _run_example("lightning_train.py", ["--watch", str(tmp_path / "w")], monkeypatch, tmp_path)
    assert _bundles(tmp_path / "w") == ["anomaly-step121"]  # row 5 of the 121st batch
    data = report_dict(*replay(tmp_path / "w" / "anomaly-step121"))
    assert data["hypotheses"][0]["id"] == "nan-in-inputs"
    assert data["localised"]["rows"] == [5] and data["localised"]["where"].startswith("lightning_train.py:")


def test_lightning_script_watched_without_code_change(monkeypatch, tmp_path):
    pytest.importorskip("lightning")
    from nnwizard.watch_cmd import run

    monkeypatch.chdir(tmp_path)
    code = run(str(WATCH / "lightning_train.py"), ["--steps", "130"], tmp_path / "w", "continue", 10, tensorboard=False)
    assert code == 0 and _bundles(tmp_path / "w") == ["anomaly-step121"]
    code = run(str(WATCH / "lightning_train.py"), ["--clean", "--steps", "130"], tmp_path / "c", "continue", 10,
               tensorboard=False)
    assert code == 0 and _bundles(tmp_path / "c") == []


def test_hf_callback_bundle_replays_the_trainer_step(monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from nnwizard import anomaly
    from nnwizard.replay import replay, report_dict

    # force one trigger at step 8 (a healthy step): its bundle must replay as the Trainer ran it
    real_check = anomaly.Detector.check

    def check(self, step, loss, grad_norm):
        found = real_check(self, step, loss, grad_norm)
        return found or (anomaly.Anomaly("loss-spike", step, "forced by the test", loss, grad_norm) if step == 8 else None)

    real_quick = anomaly.Detector.quick
    monkeypatch.setattr(anomaly.Detector, "check", check)
    monkeypatch.setattr(anomaly.Detector, "quick", lambda self, step, *a: step != 8 and real_quick(self, step, *a))
    _run_example("hf_train.py", ["--steps", "12", "--watch", str(tmp_path / "w")], monkeypatch, tmp_path)
    lines = [json.loads(l) for l in (tmp_path / "w" / "watch.jsonl").read_text().splitlines()]
    assert lines[0]["step"] == 1 and {"loss", "grad_norm", "lr"} <= set(lines[0])
    bundles = _bundles(tmp_path / "w")
    assert bundles
    meta = json.loads((tmp_path / "w" / bundles[0] / "meta.json").read_text())
    assert meta["replayable"] and meta["backward"][0]["kind"] == "output"  # the model's own loss
    data = report_dict(*replay(tmp_path / "w" / bundles[0]))
    swap = next(p for p in data["probes"] if p["id"] == "replay-swap")
    assert swap["outcome"] == "not-reproduced"  # a healthy step replays as healthy
    assert abs(swap["data"]["loss"] - meta["loss"]) < 1e-3 * max(1.0, abs(meta["loss"]))  # faithful replay


def test_hf_script_watched_without_code_change(monkeypatch, tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from nnwizard.watch_cmd import run

    monkeypatch.chdir(tmp_path)
    code = run(str(WATCH / "hf_train.py"), ["--steps", "10"], tmp_path / "w", "continue", 5, tensorboard=False)
    assert code == 0 and _bundles(tmp_path / "w") == []
    lines = [json.loads(l) for l in (tmp_path / "w" / "watch.jsonl").read_text().splitlines()]
    assert [l["step"] for l in lines] == [1, 5, 10]


@pytest.mark.slow
@pytest.mark.parametrize("script,lib", [("lightning_train.py", "lightning"), ("hf_train.py", "transformers")])
def test_diagnose_script_observes_the_trainers_steps(script, lib, monkeypatch, tmp_path):
    """`nnwizard diagnose --script` on Trainer.fit / Trainer.train: the recorder sees the optimizer steps."""
    pytest.importorskip(lib)
    from nnwizard.cli import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["diagnose", "--script", str(WATCH / script), "--non-interactive", "--json", str(tmp_path / "r.json"), "-q"])
    assert exit_.value.code == 0
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["mode"] == "script" and report["verdict"] != "inconclusive"
    observed = report.get("observed") or report.get("script") or {}
    assert observed["steps"] >= 10 and observed["exit"] in ("finished", "stopped")
