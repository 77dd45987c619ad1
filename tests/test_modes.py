"""mode-after-eval: train, evaluate, train again through the user's functions; fires when the second
training pass runs Dropout/BatchNorm in eval mode, quiet when train_epoch/train_step calls
model.train() or evaluate restores the mode."""

from __future__ import annotations


import pytest

from nnwizard.target import load_target
from tests.conftest import diagnose_example, load_example, run_probe_on

HEADER = """
import torch
from torch import nn
from examples.datasets import blobs, split
loss_fn = nn.CrossEntropyLoss()
def build_data(): return split(*blobs())
def build_model(): return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 4))
def evaluate(model, loader, loss_fn):
    model.eval()
    with torch.no_grad():
        losses = [loss_fn(model(x), y).item() for x, y in loader]
    {restore}
    return sum(losses) / len(losses)
def train_step(model, batch, loss_fn, optimizer):
    {train}
    x, y = batch
    optimizer.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.item()
"""


def module_target(tmp_path, name: str, restore: str, train: str):
    path = tmp_path / f"{name}.py"
    path.write_text(HEADER.replace("{restore}", restore).replace("{train}", train))
    return load_target(str(path), "cpu")


@pytest.mark.parametrize("name", ["healthy_cnn", "healthy_wine"])
def test_quiet_when_training_sets_train_mode(name):
    result = run_probe_on("mode-after-eval", load_example(name))
    assert result.outcome == "ok" and result.data["eval_layers"] == 0, result.summary


def test_skipped_or_quiet_without_mode_layers_or_user_functions():
    assert run_probe_on("mode-after-eval", load_example("healthy_mlp")).status == "skipped"
    assert run_probe_on("mode-after-eval", load_example("healthy_breast_cancer")).outcome == "no-mode-layers"


def test_train_epoch_without_model_train_after_evaluate():
    result = run_probe_on("mode-after-eval", load_example("broken_train_mode_missing"))
    assert result.outcome == "stays-eval"
    assert result.data["eval_layers"] == 3 and result.data["first_eval_layers"] == 0
    assert result.data["train_fn"] == "train_epoch" and result.data["eval_fn"] == "evaluate"
    assert "'1' (BatchNorm1d)" in result.data["layer_names"] and result.data["model_training_after_eval"] is False
    assert result.artifacts[0].rows[0][2:] == ["train", "eval", "eval"]


def test_either_fix_silences_it(tmp_path):
    broken = module_target(tmp_path, "neither", "pass", "pass")
    assert run_probe_on("mode-after-eval", broken).outcome == "stays-eval"
    restored = module_target(tmp_path, "restores", "model.train()", "pass")
    assert run_probe_on("mode-after-eval", restored).outcome == "ok"
    trains = module_target(tmp_path, "trains", "pass", "model.train()")
    assert run_probe_on("mode-after-eval", trains).outcome == "ok"


def test_scripted_diagnosis_ranks_the_fault_first():
    _, report = diagnose_example("broken_train_mode_missing", ["overfitting"])
    top = report.hypotheses[0]
    assert top.id == "train-mode-missing", [h.id for h in report.hypotheses[:3]]
    assert top.confidence >= 0.8 and any("model.train()" in e for e in top.evidence)
