"""simplify-ladder: one piece replaced per rung; which rungs learn points at data, model or loop."""

from __future__ import annotations

from tests.conftest import load_example, run_probe_on


def _rungs(result):
    return result.data["rungs"]


def test_healthy_setup_learns_and_stops_there():
    result = run_probe_on("simplify-ladder", load_example("healthy_mlp"))
    assert result.outcome == "ok" and _rungs(result)["your setup"] == "learns"


def test_loop_without_step_learns_nothing():
    result = run_probe_on("simplify-ladder", load_example("broken_no_step"))
    assert result.outcome == "loop"
    assert set(_rungs(result).values()) == {"does not learn"}


def test_linear_model_points_at_the_model():
    result = run_probe_on("simplify-ladder", load_example("broken_missing_nonlinearity"))
    assert result.outcome == "model"
    rungs = _rungs(result)
    assert rungs["one-hidden-layer MLP"] == "learns" and rungs["your setup"] == "does not learn"
    table = result.artifacts[0]
    assert table.columns[0] == "rung" and len(table.rows) == 6
