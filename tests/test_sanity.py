"""The four sanity probes: each fires on its fault and stays quiet on healthy modules."""

from __future__ import annotations

import pytest

from tests.conftest import diagnose_example, load_example, run_probe_on


@pytest.fixture(scope="module")
def healthy():
    return load_example("healthy_mlp")


def test_model_summary(healthy):
    quiet = run_probe_on("model-summary", healthy)
    assert quiet.outcome == "ok" and quiet.data["trainable"] == quiet.data["total"] == 5508
    frozen = run_probe_on("model-summary", load_example("broken_frozen"))
    assert frozen.outcome == "all-frozen" and frozen.data["trainable"] == 0


def test_forward_shape_names_the_layer_and_sizes():
    result = run_probe_on("forward-shape", load_example("broken_shape_mismatch"))
    assert result.outcome == "layer-shape"
    assert result.data["layer"] == "4" and result.data["layer_type"] == "Linear"
    assert result.data["layer_input"] == [32, 200] and "288 input features" in result.data["expects"]
    table = result.artifacts[0]
    assert table.marked == [len(table.rows) - 1] and table.rows[-1][3] == "raised"


def test_forward_shape_dtype_and_quiet(healthy):
    assert run_probe_on("forward-shape", healthy).outcome == "ok"
    result = run_probe_on("forward-shape", load_example("broken_label_dtype"))
    assert result.outcome == "loss-dtype" and result.data["target_dtype"] == "float32"


def test_initial_loss(healthy):
    quiet = run_probe_on("initial-loss", healthy)
    assert quiet.outcome == "ok" and 0.6 < quiet.data["ratio"] < 1.6
    high = run_probe_on("initial-loss", load_example("broken_bad_init"))
    assert high.outcome == "high" and high.data["ratio"] > 5


def test_initial_loss_has_no_per_element_expectation_for_a_summed_loss():
    import torch

    summed = load_example("healthy_mlp")
    summed.loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")  # the batch's sum: ~batch x ln(C), not a fault
    result = run_probe_on("initial-loss", summed)
    assert result.outcome == "no-reference" and "ratio" not in result.data


def test_overfit_one_batch(healthy):
    quiet = run_probe_on("overfit-one-batch", healthy)
    assert quiet.outcome == "learns" and quiet.data["accuracy"] == 1.0
    assert quiet.artifacts[0].series["loss"][0] > quiet.data["final_loss"]
    stuck = run_probe_on("overfit-one-batch", load_example("broken_no_step"))
    assert stuck.outcome == "unchanged" and stuck.data["max_param_change"] == 0.0
    assert stuck.data["step_fn"] == "train_step"


@pytest.mark.parametrize("name, hypothesis", [
    ("broken_shape_mismatch", "layer-shape-mismatch"),
    ("broken_label_dtype", "labels-wrong-dtype"),
    ("broken_frozen", "frozen-parameters"),
])
def test_scripted_diagnosis_ranks_the_fault_first(name, hypothesis):
    _, report = diagnose_example(name, ["crash"] if "frozen" not in name else ["flat"])
    assert report.verdict == "problems-found"
    assert report.hypotheses[0].id == hypothesis and report.hypotheses[0].confidence >= 0.5


def test_healthy_examples_are_healthy():
    for name in ("healthy_mlp", "healthy_cnn"):
        _, report = diagnose_example(name, ["flat"])
        assert report.verdict == "healthy", [(h.id, h.confidence) for h in report.hypotheses]


def test_overfit_crash_in_place_names_the_forward_line():
    result = run_probe_on("overfit-one-batch", load_example("broken_inplace_modification"))
    assert result.outcome == "crashed" and result.data["kind"] == "inplace"
    assert result.data["origin"].startswith("broken_inplace_modification.py:19 in forward: h = torch.tanh")
    quiet = run_probe_on("overfit-one-batch", load_example("healthy_cnn"))
    assert quiet.outcome == "learns" and "origin" not in quiet.data
    _, report = diagnose_example("broken_inplace_modification", ["crash"])
    assert report.hypotheses[0].id == "inplace-modification" and report.hypotheses[0].confidence >= 0.5


def test_overfit_sees_a_step_minimising_another_loss():
    result = run_probe_on("overfit-one-batch", load_example("broken_loss_wrong_tensor"), seed=1)
    assert result.outcome == "target-mismatch"
    assert result.data["final_loss"] < 0.1 * result.data["first_loss"]
    assert result.data["true_end"] > 0.5 * result.data["true_start"]
    for name in ("healthy_mlp", "healthy_clip_accum", "broken_loss_reduction_mismatch"):
        assert run_probe_on("overfit-one-batch", load_example(name)).outcome != "target-mismatch", name
