"""The bundled watch examples: each anomaly caught at its step, and its bundle replayed to the cause."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WATCH = ROOT / "examples" / "watch"


def _run_script(name, args, monkeypatch, tmp_path):
    from nnwizard.watch_cmd import run

    monkeypatch.chdir(tmp_path)
    code = run(str(WATCH / name), args, tmp_path / "w", "continue", 10, tensorboard=False)
    return code, sorted(p.name for p in (tmp_path / "w").glob("anomaly-step*"))


def test_bad_batch_caught_at_step_301_and_replayed_to_the_row(monkeypatch, tmp_path):
    from nnwizard.replay import replay, report_dict

    code, bundles = _run_script("bad_batch.py", [], monkeypatch, tmp_path)
    assert code == 0
    assert bundles == ["anomaly-step301"]  # record 9607 is row 7 of the 301st batch; nothing before it fires
    data = report_dict(*replay(tmp_path / "w" / "anomaly-step301"))
    assert data["hypotheses"][0]["id"] == "nan-in-inputs" and data["hypotheses"][0]["confidence"] >= 0.5
    assert data["localised"]["rows"] == [7] and data["localised"]["where"].startswith("bad_batch.py:")


def test_clean_run_of_the_same_script_saves_nothing(monkeypatch, tmp_path):
    code, bundles = _run_script("bad_batch.py", ["--corrupt", "none"], monkeypatch, tmp_path)
    assert code == 0 and bundles == []
    lines = (tmp_path / "w" / "watch.jsonl").read_text().splitlines()
    assert len(lines) >= 40 and all("anomaly" not in json.loads(l) for l in lines)


def test_warmup_mistake_caught_and_blamed_on_the_lr(monkeypatch, tmp_path):
    from nnwizard.replay import replay, report_dict

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["warmup.py", "--steps", "460", "--watch", str(tmp_path / "w")])
    import runpy

    runpy.run_path(str(WATCH / "warmup.py"), run_name="__main__")
    bundles = sorted((tmp_path / "w").glob("anomaly-step*"), key=lambda p: int(p.name[12:]))
    assert bundles, "the divergence should have been caught"
    first = json.loads((bundles[0] / "meta.json").read_text())
    # healthy for a few hundred steps: nothing fires before the LR is far beyond the intended 0.01
    assert first["step"] > 300 and first["lrs"][0] > 10 * 0.01
    diagnosis, target = replay(bundles[0])
    data = report_dict(diagnosis, target)
    assert data["hypotheses"][0]["id"] == "lr-too-high" and data["verdict"] == "problems-found"
    assert not any(h["id"] in ("nan-in-inputs", "bad-batch") and h["confidence"] >= 0.5 for h in data["hypotheses"])
    # the replay judges "reproduced" by the trigger's own window (the last 50 *measured* gradient norms:
    # watch measures the norm every k steps), so the anomaly that fired reproduces and is localised
    swap = next(r for r in diagnosis.results if r.id == "replay-swap")
    assert swap.outcome != "not-reproduced", swap.summary
    assert data["localised"] is not None


@pytest.mark.slow
def test_cli_watch_stop_then_replay(tmp_path):
    """The real commands: `nnwizard watch --script ... --on-anomaly stop`, then `nnwizard replay`."""
    import subprocess

    watch = subprocess.run([sys.executable, "-m", "nnwizard", "watch", "--script", str(WATCH / "bad_batch.py"),
                            "--out", str(tmp_path / "w"), "--on-anomaly", "stop"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert watch.returncode == 1, watch.stderr
    assert "replay bundle: " in watch.stderr and "stopped at step 301" in watch.stderr
    assert "step 400" not in watch.stdout  # the run ended at the anomaly
    bundle = tmp_path / "w" / "anomaly-step301"
    replayed = subprocess.run([sys.executable, "-m", "nnwizard", "replay", str(bundle), "--json", str(tmp_path / "r.json"),
                               "--report", str(tmp_path / "r.md"), "-q"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
    assert replayed.returncode == 0, replayed.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["mode"] == "replay" and data["step"] == 301 and data["hypotheses"][0]["id"] == "nan-in-inputs"
    assert "Localised:" in (tmp_path / "r.md").read_text() and "bad_batch.py:" in (tmp_path / "r.md").read_text()


def test_replay_of_a_missing_folder_is_a_usage_error(tmp_path):
    from nnwizard.errors import UsageError
    from nnwizard.replay import load_replay_target

    with pytest.raises(UsageError):
        load_replay_target(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError):
        load_replay_target(tmp_path / "empty")


MANUAL_UPDATE = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Linear(4, 1)
x, y = torch.randn(64, 4), torch.randn(64, 1)
for step in range(30):
    model.zero_grad()
    nn.functional.mse_loss(model(x), y).backward()
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-0.1)
"""


def test_a_hand_written_update_says_why_nothing_was_logged(monkeypatch, tmp_path, capsys):
    from nnwizard.watch_cmd import run

    path = tmp_path / "manual.py"
    path.write_text(MANUAL_UPDATE)
    monkeypatch.chdir(tmp_path)
    assert run(str(path), [], tmp_path / "w", "continue", 10, tensorboard=False) == 0
    err = capsys.readouterr().err
    assert "called backward() 30 times but never optimizer.step()" in err and "hand-written update" in err, err


DIVERGING = '''
import sys
import torch
from torch import nn

torch.manual_seed(0)
X, Y = torch.randn(512, 20), torch.randint(0, 5, (512,))
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 5))
opt = torch.optim.Adam(model.parameters(), lr=float(sys.argv[1]))
crit = nn.CrossEntropyLoss()
for step in range(60):
    i = (step * 32) % 512
    loss = crit(model(X[i:i + 32]), Y[i:i + 32])
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 0.25)   # keeps the diverged run finite
    opt.step()
'''


@pytest.mark.parametrize("lr, expected", [("5.0", ["anomaly-step4"]), ("0.003", [])])
def test_a_run_that_diverges_in_its_first_steps_is_caught_and_replayed_to_the_lr(monkeypatch, tmp_path, lr, expected):
    from nnwizard.replay import replay, report_dict
    from nnwizard.watch_cmd import run

    script = tmp_path / "train.py"
    script.write_text(DIVERGING)
    monkeypatch.chdir(tmp_path)
    assert run(str(script), [lr], tmp_path / "w", "continue", 10, tensorboard=False) == 0
    bundles = sorted(p.name for p in (tmp_path / "w").glob("anomaly-step*"))
    assert bundles == expected   # Adam at 5.0: 1.61, 2232, 3603, 3970: the third in a row above 30x the first
    if bundles:
        data = report_dict(*replay(tmp_path / "w" / bundles[0]))
        assert data["hypotheses"][0]["id"] == "lr-too-high" and data["verdict"] == "problems-found"
        history = next(p for p in data["probes"] if p["id"] == "replay-history")
        assert history["outcome"] == "diverged-from-start" and history["data"]["jump_step"] == 2


def test_diverged_from_start_needs_the_early_jump_at_a_steady_lr():
    from nnwizard.probes.replay import _diverged_from_start

    def points(losses, lrs=None):
        return [{"step": i, "loss": v, "lr": (lrs or [0.1] * len(losses))[i - 1]} for i, v in enumerate(losses, 1)]

    assert _diverged_from_start(points([2.3, 80.0, 90.0]))[1]["jump_step"] == 2
    assert _diverged_from_start(points([2.3, 20.0, 40.0])) is None                       # under 30x
    assert _diverged_from_start(points([2.3, 80.0], [0.001, 0.5])) is None               # a warm-up ramp: replay-history's other rule
    assert _diverged_from_start(points([2.3] * 10 + [90.0])) is None                     # after the first 10 steps
    assert _diverged_from_start([{"step": 5, "loss": 2.3, "lr": 0.1}, {"step": 6, "loss": 90.0, "lr": 0.1}]) is None
