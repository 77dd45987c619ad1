"""Learning-rate probes (lr-sweep, oscillation), both directions, and their examples' diagnoses."""

from __future__ import annotations

import importlib

import pytest

from tests.conftest import diagnose_example, load_example, run_probe_on


@pytest.fixture(scope="module")
def healthy():
    return load_example("healthy_mlp")


def test_lr_sweep(healthy):
    low = run_probe_on("lr-sweep", load_example("broken_lr_too_low"))
    assert low.outcome == "too-low" and low.data["drop_lr"] < 0.1 and low.data["drop_up"] > 0.2
    assert run_probe_on("lr-sweep", healthy).outcome == "ok"
    # nothing learns at any rate when every ReLU is dead: the sweep must not blame the lr
    assert run_probe_on("lr-sweep", load_example("broken_dead_relu")).outcome == "none-learns"


def test_oscillation(healthy):
    noisy = run_probe_on("oscillation", load_example("broken_batch_too_small"))
    assert noisy.outcome == "batch-helps", noisy.summary
    assert noisy.data["final_batch2"] < noisy.data["final_lr3"]
    assert run_probe_on("oscillation", healthy).outcome == "ok"


@pytest.mark.parametrize("name", ["broken_lr_too_low", "broken_batch_too_small"])
def test_lr_diagnoses(name):
    expected = importlib.import_module(f"examples.{name}").EXPECTED
    _, report = diagnose_example(name, expected["symptoms"])
    top = report.hypotheses[0]
    assert top.id in expected["hypotheses"] and top.confidence >= 0.5, [(h.id, h.confidence) for h in report.hypotheses[:3]]
