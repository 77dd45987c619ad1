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
