"""trace-nan on a run that explodes early, falls back to a plateau and turns non-finite much later: the
explosion before the non-finite step is the lead (the gradient norm's peak, not its last value)."""

from __future__ import annotations

from types import SimpleNamespace

from nnwizard.probes.api import ProbeContext, get
from nnwizard.record import Recording, StepRecord


def _run(norms: list[float | None], losses: list[float]) -> Recording:
    rec = Recording()
    for i, (norm, loss) in enumerate(zip(norms, losses), start=1):
        rec.steps.append(StepRecord(step=i, optimizer=0, t=0.1 * i, loss=loss, losses=[loss], backwards=1,
                                    grad_norm=norm, zero_grad=True, lrs=[1.0], epoch=1, batch=i - 1))
    return rec


def _judge(rec: Recording):
    return get("trace-nan")(ProbeContext(SimpleNamespace(recording=rec)))


def test_an_explosion_long_before_the_non_finite_step_is_growth():
    # step 3 blows up (norm 50,000x), the run then sits at a high level with ordinary norms, step 14 is NaN
    norms = [2.0, 3.0, 1e5, 40.0] + [None, 1.5] * 4 + [1.2, None]
    losses = [50.0, 48.0, 3e6, 9e4] + [9e4] * 9 + [float("nan")]
    result = _judge(_run(norms, losses))
    assert result.outcome == "nan-after-growth", result.summary
    assert "by step 3" in result.summary and result.data["growth"] > 1e4


def test_a_steady_run_that_turns_non_finite_is_no_growth():
    norms = [2.0, 1.9, 2.1, 1.8, 2.0, 2.2, 1.9, None]
    losses = [5.0, 4.8, 4.6, 4.5, 4.4, 4.3, 4.2, float("inf")]
    assert _judge(_run(norms, losses)).outcome == "nan"
