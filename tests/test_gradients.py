"""Gradient and activation probes, both directions, and the scripted diagnoses of their examples."""

from __future__ import annotations

import importlib

import pytest

from tests.conftest import diagnose_example, load_example, run_probe_on


@pytest.fixture(scope="module")
def healthy():
    return load_example("healthy_mlp")


def test_grad_norms_vanishing_and_plot(healthy):
    result = run_probe_on("grad-norms", load_example("broken_vanishing_gradients"))
    assert result.outcome == "vanishing" and result.data["depth_ratio"] < 1e-3
    plot = next(a for a in result.artifacts if a.kind == "bar")
    assert plot.logy and plot.labels[0] == "0.weight"
    quiet = run_probe_on("grad-norms", healthy)
    assert quiet.outcome == "ok" and quiet.data["depth_ratio"] > 1e-2


def test_grad_norms_exploding_and_zero():
    assert run_probe_on("grad-norms", load_example("broken_exploding_gradients")).outcome == "exploding"
    dead = run_probe_on("grad-norms", load_example("broken_dead_relu"))
    assert dead.outcome == "zero" and "0.weight" in dead.data["zero"]


def test_activation_stats(healthy):
    dead = run_probe_on("activation-stats", load_example("broken_dead_relu"))
    assert dead.outcome == "dead" and dead.data["dead_fraction"] > 0.5
    sat = run_probe_on("activation-stats", load_example("broken_saturated_activations"))
    assert sat.outcome == "saturated" and sat.data["saturated_layer"].startswith("hidden.")
    for name in ("healthy_mlp", "healthy_cnn"):
        assert run_probe_on("activation-stats", load_example(name)).outcome in ("ok", "no-activations")


@pytest.mark.parametrize("name", ["broken_vanishing_gradients", "broken_dead_relu", "broken_saturated_activations",
                                  "broken_bad_init"])
def test_flat_diagnoses(name):
    expected = importlib.import_module(f"examples.{name}").EXPECTED
    _, report = diagnose_example(name, expected["symptoms"])
    top = report.hypotheses[0]
    assert top.id in expected["hypotheses"] and top.confidence >= 0.5, [(h.id, h.confidence) for h in report.hypotheses[:3]]


_LR_DEAD = '''
import torch
from torch import nn
from examples.datasets import blobs, split

def build_model():
    return nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))

def build_data():
    return split(*blobs())

loss_fn = nn.CrossEntropyLoss()

def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=LR)
'''


def test_activation_stats_dead_from_the_step_size(tmp_path):
    """ReLUs alive at initialisation that die at a huge lr, and live and train better at a lower one, are
    the lr's doing (dead-lr); a net dead at initialisation stays 'dead'; a sane lr stays quiet."""
    from nnwizard.target import load_target

    (tmp_path / "lr_dead.py").write_text(_LR_DEAD.replace("lr=LR", "lr=1.0"))
    result = run_probe_on("activation-stats", load_target(str(tmp_path / "lr_dead.py"), "cpu"))
    assert result.outcome == "dead-lr", result.summary
    assert result.data["dead_init"] <= 0.5 < result.data["dead_fraction"]
    assert result.data["dead_lower_lr"] <= 0.5 and result.data["loss_lower_lr"] < result.data["loss_lr"]
    (tmp_path / "lr_ok.py").write_text(_LR_DEAD.replace("lr=LR", "lr=1e-3"))
    assert run_probe_on("activation-stats", load_target(str(tmp_path / "lr_ok.py"), "cpu")).outcome == "ok"
    at_init = run_probe_on("activation-stats", load_example("broken_dead_relu"))
    assert at_init.outcome == "dead" and at_init.data["dead_init"] > 0.5


_SIGMOID_DECODER = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(3)
_codes = torch.randn(512, 6)
_pixels = (torch.sigmoid(_codes @ torch.randn(6, 64) * 2) > 0.5).float()   # binary "images" made from 6 factors


def build_model():  # an autoencoder whose decoder ends in a sigmoid (probabilities per pixel)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 6), nn.Linear(6, 32), nn.ReLU(),
                         nn.Linear(32, 64), nn.Sigmoid())


def build_data():
    return DataLoader(TensorDataset(_pixels[:384], _pixels[:384]), batch_size=64, shuffle=True), \\
        DataLoader(TensorDataset(_pixels[384:], _pixels[384:]), batch_size=64)


loss_fn = nn.BCELoss()


def build_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=RATE)
'''


def test_a_sigmoid_saturated_by_the_step_size_is_the_learning_rate(tmp_path):
    """A sigmoid output healthy at initialisation that ends in its tails after training at a huge lr, and stays out
    of them while training better at a lower one, is the lr's doing (saturated-lr), not the initialisation."""
    from nnwizard.target import load_target

    (tmp_path / "sig_hot.py").write_text(_SIGMOID_DECODER.replace("lr=RATE", "lr=3.0"))
    result = run_probe_on("activation-stats", load_target(str(tmp_path / "sig_hot.py"), "cpu"))
    assert result.outcome == "saturated-lr", result.summary
    assert result.data["saturated_init"] <= 0.5 < result.data["saturated_fraction"]
    assert result.data["saturated_lower_lr"] <= 0.5 and result.data["loss_lower_lr"] < result.data["loss_lr"]
    (tmp_path / "sig_ok.py").write_text(_SIGMOID_DECODER.replace("lr=RATE", "lr=3e-3"))
    assert run_probe_on("activation-stats", load_target(str(tmp_path / "sig_ok.py"), "cpu")).outcome == "ok"
